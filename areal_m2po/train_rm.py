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
from areal_m2po.api.config_loader import config_to_yaml, format_help, load_config

__all__ = ["main"]

EXIT_BAD_CONFIG = 2
_HELP_FLAGS = ("-h", "--help")
_PRINT_CONFIG = "--print-config"

USAGE = """\
usage: python -m areal_m2po.train_rm [--config FILE.yaml] [--print-config] [-h]
                                     [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]

Train a Bradley-Terry reward model (AutoModelForSequenceClassification, one label) from
preference pairs {prompt, chosen, rejected[, margin]} and save it in Hugging Face format for
reward.model.path of python -m areal_m2po.train. Settings come from the defaults below, then
--config FILE.yaml, then the KEY=VALUE overrides (the three forms are equivalent).

options:
  --config FILE.yaml  YAML file with any subset of the keys below (may be repeated)
  --print-config      print the resolved config as YAML and exit
  -h, --help          show this help and exit
"""


def _error(message: str) -> None:
    print("error: " + " ".join(message.split()), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), then print help/config or train.

    Returns 0 for ``--help``/``--print-config`` and a finished run, 2 for bad input.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in _HELP_FLAGS for a in args):
        sys.stdout.write(format_help(RWConfig, usage=USAGE))
        return 0
    print_config = _PRINT_CONFIG in args
    args = [a for a in args if a != _PRINT_CONFIG]
    try:
        cfg = load_config(args, RWConfig)
        if not print_config:
            cfg.check_required()
    except ValueError as exc:  # ConfigError and any other bad-config problem
        _error(str(exc))
        return EXIT_BAD_CONFIG
    if print_config:
        sys.stdout.write(config_to_yaml(cfg))
        return 0
    from areal_m2po.trainer.rw_trainer import run

    return run(cfg)


if __name__ == "__main__":
    sys.exit(main())
