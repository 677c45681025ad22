"""``python -m areal_m2po.train_dpo``: direct preference optimization of a causal LM from
preference pairs (beside the RLHF pipeline's reward model + PPO: SFT, then DPO on the pairs).

    python -m areal_m2po.train_dpo [--config FILE.yaml] [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]
    python -m areal_m2po.train_dpo --help
    python -m areal_m2po.train_dpo --config configs/rlhf/dpo.yaml --print-config

Same config system as ``python -m areal_m2po.train`` with :class:`DPOConfig` as the root: a bad
config, a missing ``train_dataset.path`` or a bad preference pair exits with status 2 and one
line ``error: ...`` on stderr, before any model loads.
"""

from __future__ import annotations

import sys

from areal_m2po.api.cli_args import DPOConfig
from areal_m2po.entry import EXIT_BAD_CONFIG, config_main, exit_status

__all__ = ["EXIT_BAD_CONFIG", "main"]

USAGE = """\
usage: python -m areal_m2po.train_dpo [--config FILE.yaml] [--print-config] [-h]
                                      [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]

Direct preference optimization: learn from preference pairs {prompt, chosen, rejected} (strings
or lists of {role, content} turns) against a frozen reference (the start model; with LoRA, the
model with its adapter disabled), with the sigmoid (DPO, optional label smoothing) or IPO loss;
evaluate the held-out preference accuracy and reward margins, and save the model in Hugging Face
format. Settings come from the defaults below, then --config FILE.yaml, then the KEY=VALUE
overrides (the three forms are equivalent).
"""


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then print help/config or train.

    Returns 0 for ``--help``/``--print-config`` and a finished run, 2 for bad input.
    """
    return config_main(
        argv,
        DPOConfig,
        "areal_m2po.trainer.dpo_trainer:run",
        usage=USAGE,
        check_before_run=DPOConfig.check_required,
    )


if __name__ == "__main__":
    sys.exit(exit_status(main()))
