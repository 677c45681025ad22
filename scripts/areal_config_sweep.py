"""Try every AReaL config file under a folder the way ``python -m areal_m2po.train --config
FILE --print-config`` reads it (or ``train_sft``/``train_dpo``/``train_rm`` for AReaL's SFT, DPO
and reward-model files, told by their ``train_dataset.type``), and print one line per file:
the entry point, then ``loads`` or the one-line error.

    python scripts/areal_config_sweep.py tests/data/areal [--skip NAME ...] [KEY=VALUE ...]

Files are the ``*.yaml``/``*.yml`` under the folder (recursively, sorted). ``--skip`` leaves out
files whose path relative to the folder ends with NAME. ``KEY=VALUE`` overrides are appended to
each file's command line. The last line counts the outcomes. Nothing is trained and no model
loads; the exit status is 0 whatever the files do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from areal_m2po.api.cli_args import DPOConfig, PPOConfig, RWConfig, SFTConfig
from areal_m2po.api.config_loader import load_config

TRAINERS = {"sft": ("train_sft", SFTConfig), "dpo": ("train_dpo", DPOConfig)}
TRAINERS["rw"] = ("train_rm", RWConfig)
"""AReaL's ``train_dataset.type`` -> the entry point and root config that read the file."""


def trainer_for(path: Path) -> tuple[str, type]:
    """The entry point and root config for one file (the RL trainer's unless its
    ``train_dataset.type`` is sft, dpo or rw; a file that does not parse goes to the RL one)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return "train", PPOConfig
    section = data.get("train_dataset") if isinstance(data, dict) else None
    kind = section.get("type") if isinstance(section, dict) else None
    return (
        TRAINERS.get(kind, ("train", PPOConfig)) if isinstance(kind, str) else ("train", PPOConfig)
    )


def sweep_one(path: Path, overrides: list[str], cls: type = PPOConfig) -> str:
    """``"loads"`` or ``"error: <key>: <message>"`` (first line) for one file, with the
    warning line of ignored keys (if any) counted as loading."""
    try:
        load_config(["--config", str(path), *overrides], cls, warn=lambda _line: None)
    except ValueError as exc:  # ConfigError and any other bad-config problem
        text = str(exc).strip().splitlines()
        return f"error: {text[0] if text else type(exc).__name__}"
    return "loads"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--skip", action="append", default=[], metavar="NAME")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    files = sorted(p for p in args.folder.rglob("*") if p.suffix in (".yaml", ".yml"))
    loads = 0
    total = 0
    for path in files:
        rel = path.relative_to(args.folder).as_posix()
        if any(rel.endswith(name) for name in args.skip):
            continue
        entry, cls = trainer_for(path)
        outcome = sweep_one(path, args.overrides, cls)
        total += 1
        loads += outcome == "loads"
        print(f"{rel}: ({entry}) {outcome}")
    print(f"{loads} of {total} load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
