"""``python -m areal_m2po.train_rm``: train a Bradley-Terry reward model from preference pairs.

    python -m areal_m2po.train_rm [--config FILE.yaml] [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]
    python -m areal_m2po.train_rm --help
    python -m areal_m2po.train_rm --config configs/rm_tiny.yaml --print-config

Same config system as ``python -m areal_m2po.train`` with :class:`RWConfig` as the root: a bad
config, a missing ``train_dataset.path`` or a bad preference record exits with status 2 and one
line ``error: ...`` on stderr, before any model loads.
"""

from __future__ import annotations

import sys

from areal_m2po.api.cli_args import RWConfig
from areal_m2po.entry import EXIT_BAD_CONFIG, config_main, exit_status

__all__ = ["EXIT_BAD_CONFIG", "main"]

USAGE = """\
usage: python -m areal_m2po.train_rm [--config FILE.yaml] [--print-config] [-h]
                                     [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]

Train a Bradley-Terry reward model (AutoModelForSequenceClassification, one label) from
preference pairs {prompt, chosen, rejected[, margin]} and save it in Hugging Face format for
reward.model.path of python -m areal_m2po.train. Settings come from the defaults below, then
--config FILE.yaml, then the KEY=VALUE overrides (the three forms are equivalent).
"""


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then print help/config or train.

    Returns 0 for ``--help``/``--print-config`` and a finished run, 2 for bad input.
    """
    return config_main(
        argv,
        RWConfig,
        "areal_m2po.trainer.rw_trainer:run",
        usage=USAGE,
        check_before_run=RWConfig.check_required,
    )


if __name__ == "__main__":
    sys.exit(exit_status(main()))
