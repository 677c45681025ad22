"""What the tests that start processes share: the repository's paths, the environment of a
child process, ``accelerate launch`` of CPU processes, the tiny training command and its
metrics.

``tests/support`` is on pytest's ``pythonpath`` (pyproject.toml), so tests import this as
``procs`` and a child process finds ``toy_rewards`` and the workers through
:func:`subprocess_env`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from areal_m2po.trainer.launch import cpu_launch_command

SUPPORT = Path(__file__).resolve().parent
"""``tests/support``: the workers and ``toy_rewards``."""
REPO = SUPPORT.parents[1]
TIMEOUT_S = 300
"""Seconds a child process may take."""


def subprocess_env() -> dict[str, str]:
    """This environment with ``tests/support`` and the repository first on ``PYTHONPATH`` and
    one OpenMP thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SUPPORT), str(REPO), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def launch_command(n: int) -> list[str]:
    """``accelerate launch`` of ``n`` CPU processes (gloo)."""
    return cpu_launch_command(n)


def popen(cmd: list[str], cwd: Path) -> subprocess.Popen:
    """Start ``cmd`` in ``cwd`` with :func:`subprocess_env`, stdout and stderr together."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def check_exit(procs: list[subprocess.Popen]) -> None:
    """Wait for each process; fail with the end of its output unless it exited 0."""
    for p in procs:
        out, _ = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, out[-4000:]


def train_command(out: Path, steps: int, *extra: str) -> list[str]:
    """``python`` arguments of a tiny training run into ``out`` with recover checkpoints every
    step (``extra``: more overrides)."""
    return [
        "-m",
        "areal_m2po.train",
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        f"output_dir={out}",
        f"total_train_steps={steps}",
        "num_threads=1",
        "reward.path=toy_rewards:digit_fraction",
        "evaluator.eval_at_end=false",
        "saver.save_at_end=false",
        "recover.mode=auto",
        "recover.freq_steps=1",
        *extra,
    ]


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, in order."""
    with open(Path(run_dir) / "metrics.jsonl") as fh:
        return [json.loads(line) for line in fh if line.strip()]
