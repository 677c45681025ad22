"""``python -m areal_m2po.train``: load the config, then train.

    python -m areal_m2po.train [--config FILE.yaml] [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]
    python -m areal_m2po.train --help
    python -m areal_m2po.train --config configs/tiny.yaml --print-config

The config is loaded and validated before anything heavy is imported: a bad config exits with
status 2 and one line ``error: <key>: <message>`` on stderr, before torch, transformers or any
model or data loads. Only a valid config reaches
:func:`areal_m2po.trainer.rl_trainer.run`, whose return value is the exit status.
"""

from __future__ import annotations

import sys

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.entry import EXIT_BAD_CONFIG, config_main, exit_status
from areal_m2po.utils.fd_limit import raise_open_file_limit

__all__ = ["EXIT_BAD_CONFIG", "main"]


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then print help/config or train.

    Returns the exit status: 0 for ``--help``/``--print-config``, 2 for a bad config, else what
    ``run(cfg)`` returns.
    """
    raise_open_file_limit()  # the agent endpoint's connections must not starve the run's files
    return config_main(argv, PPOConfig, "areal_m2po.trainer.rl_trainer:run")


if __name__ == "__main__":
    sys.exit(exit_status(main()))
