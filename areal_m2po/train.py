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

from areal_m2po.api.cli_args import ConfigError, PPOConfig
from areal_m2po.api.config_loader import config_to_yaml, format_help, load_config

__all__ = ["main"]

EXIT_BAD_CONFIG = 2
_HELP_FLAGS = ("-h", "--help")
_PRINT_CONFIG = "--print-config"


def _error(message: str) -> None:
    """Print one ``error: ...`` line on stderr (newlines folded)."""
    print("error: " + " ".join(message.split()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then print help/config or train.

    Returns the exit status: 0 for ``--help``/``--print-config``, 2 for a bad config, else what
    ``run(cfg)`` returns.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in _HELP_FLAGS for a in args):
        sys.stdout.write(format_help(PPOConfig))
        return 0
    print_config = _PRINT_CONFIG in args
    args = [a for a in args if a != _PRINT_CONFIG]
    try:
        cfg = load_config(args, PPOConfig)
    except ValueError as exc:  # ConfigError and any other bad-config problem
        _error(str(exc))
        return EXIT_BAD_CONFIG
    if print_config:
        sys.stdout.write(config_to_yaml(cfg))
        return 0
    from areal_m2po.trainer.rl_trainer import run  # heavy: only once the config is valid

    try:
        status = run(cfg)
    except ConfigError as exc:
        _error(str(exc))
        return EXIT_BAD_CONFIG
    return 0 if status is None else int(status)


if __name__ == "__main__":
    sys.exit(main())
