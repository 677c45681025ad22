"""A study run's name, its two directories and the files read from them.

Each run ``<arm>_s<staleness>_seed<seed>`` trains into ``<work_dir>/<name>/`` (the trainer's
``output_dir``: metrics, config, recover checkpoints, log; outside the git tree). When it has
finished, its small files (no weights) are copied to ``<archive_dir>/<name>/`` in the repository,
with a ``done.json`` marker; a run with that marker in either place is finished and never rerun,
and the report is computed from those files alone.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DONE_FILE = "done.json"  # written when a run finished with its last evaluation logged
RUN_INFO_FILE = "study_run.json"  # the command, exit status and wall time of each attempt
ARCHIVED_FILES = ("metrics.jsonl", "config.yaml", RUN_INFO_FILE, DONE_FILE)


@dataclass(frozen=True)
class RunKey:
    """Which run: the arm, its staleness and its seed."""

    arm: str
    staleness: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}_s{self.staleness}_seed{self.seed}"

    @classmethod
    def parse(cls, name: str) -> RunKey | None:
        """The key of a run directory's name, or None when it is not ``<arm>_s<s>_seed<k>``."""
        head, _, seed = name.rpartition("_seed")
        arm, _, s = head.rpartition("_s")
        if not (arm and s.isdigit() and seed.isdigit()):
            return None
        return cls(arm, int(s), int(seed))


def read_json(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of ``run_dir/metrics.jsonl`` (empty when there is none)."""
    from areal_m2po.plot import read_metrics as _read

    path = os.path.join(run_dir, "metrics.jsonl")
    return _read(path) if os.path.exists(path) else []


def read_config(run_dir: str) -> dict[str, Any]:
    """The run's resolved ``config.yaml`` as a nested dict (empty when there is none)."""
    import yaml

    path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def reached_end(run_dir: str, steps: int) -> bool:
    """True when ``metrics.jsonl`` has the evaluation after update ``steps``."""
    return any(r.get("step") == steps and "eval/accuracy" in r for r in read_metrics(run_dir))


def finished_dir(key: RunKey, archive_dir: str, work_dir: str) -> str | None:
    """The directory holding the finished run ``key`` (archive first), or None."""
    for root in (archive_dir, work_dir):
        run_dir = os.path.join(root, key.name)
        if os.path.exists(os.path.join(run_dir, DONE_FILE)):
            return run_dir
    return None


def archive_run(run_dir: str, archive_dir: str) -> str:
    """Copy a finished run's small files (no weights) to ``archive_dir/<name>``; its path."""
    target = os.path.join(archive_dir, os.path.basename(run_dir))
    os.makedirs(target, exist_ok=True)
    for name in ARCHIVED_FILES:
        src = os.path.join(run_dir, name)
        if os.path.exists(src):
            shutil.copy2(src, os.path.join(target, name))
    return target


def discover(roots: list[str]) -> dict[RunKey, str]:
    """Every run directory with metrics under ``roots``; a finished one (``done.json``) wins
    over an unfinished one of the same name, and an earlier root over a later one."""
    found: dict[RunKey, str] = {}
    for root in roots:
        if not os.path.isdir(root):
            continue
        for name in sorted(os.listdir(root)):
            key = RunKey.parse(name)
            run_dir = os.path.join(root, name)
            if key is None or not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
                continue
            done = os.path.exists(os.path.join(run_dir, DONE_FILE))
            if key not in found or (
                done and not os.path.exists(os.path.join(found[key], DONE_FILE))
            ):
                found[key] = run_dir
    return found


def is_done(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, DONE_FILE))


def run_times(attempts: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``wall_s`` and ``cpu_s`` (seconds) of the attempts that made the finished run: those from
    the last one that started at update 0. Empty when one of them recorded no time: an attempt
    still running has none yet, and one killed with its scheduler (a session that stopped)
    never gets them, so a sum over the others would understate the run."""
    fresh = [i for i, a in enumerate(attempts) if a.get("resumed_from_step") == 0]
    used = attempts[fresh[-1] :] if fresh else attempts
    if not used or not all("wall_s" in a for a in used):
        return {}
    return {
        "wall_s": sum(float(a["wall_s"]) for a in used),
        "cpu_s": sum(float(a.get("cpu_s", float("nan"))) for a in used),
    }
