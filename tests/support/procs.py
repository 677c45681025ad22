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
import sys
from pathlib import Path

from areal_m2po.utils.dist import cpu_launch_command

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


def node_launch_command(
    num_machines: int, machine_rank: int, num_processes: int, port: int
) -> list[str]:
    """``accelerate launch`` of node ``machine_rank`` of ``num_machines`` "nodes" on this machine
    (over 127.0.0.1, gloo), ``num_processes`` processes in all; node 0 listens on ``port``."""
    cmd = cpu_launch_command(num_processes, port)
    i = cmd.index("--num_machines")
    cmd[i + 1] = str(num_machines)
    return [*cmd, "--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1"]


def popen(cmd: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    """Start ``cmd`` in ``cwd`` with :func:`subprocess_env` (and ``env`` on top), stdout and
    stderr together."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**subprocess_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def check_exit(procs: list[subprocess.Popen]) -> None:
    """Wait for each process; fail with the end of its output unless it exited 0."""
    for p in procs:
        out, _ = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, out[-4000:]


def tiny_train_args(out: str | Path, steps: int, *extra: str) -> list[str]:
    """``python -m areal_m2po.train`` arguments of a tiny run (configs/tiny.yaml) into ``out``:
    one thread, the toy reward, no final evaluation or save (``extra``: more overrides)."""
    return [
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        f"output_dir={out}",
        f"total_train_steps={steps}",
        "num_threads=1",
        "reward.path=toy_rewards:digit_fraction",
        "evaluator.eval_at_end=false",
        "saver.save_at_end=false",
        *extra,
    ]


def train_command(out: Path, steps: int, *extra: str) -> list[str]:
    """``python`` arguments of a tiny training run into ``out`` with recover checkpoints every
    step (``extra``: more overrides)."""
    recover = ("recover.mode=auto", "recover.freq_steps=1")
    return ["-m", "areal_m2po.train", *tiny_train_args(out, steps, *recover, *extra)]


def spawn_train(args: list[str], new_session: bool = False) -> subprocess.Popen:
    """``python -m areal_m2po.train *args`` from the repository with :func:`subprocess_env`,
    stdout and stderr piped apart (``new_session``: in a process group of its own)."""
    return subprocess.Popen(
        [sys.executable, "-m", "areal_m2po.train", *args],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


def process_table() -> list[tuple[int, list[bytes], str, int]]:
    """``(pid, argv, state, process group)`` of every process in ``/proc`` (state ``Z``: a
    zombie); processes that end while being read are left out."""
    table = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table.append((int(name), argv, fields[0], int(fields[2])))
    return table


def read_metrics(run_dir: str | Path, missing_ok: bool = False) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, in order (``missing_ok``: [] without one)."""
    path = Path(run_dir) / "metrics.jsonl"
    if missing_ok and not path.exists():
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def untimed(record: dict) -> dict:
    """A metrics record without its ``timing/*`` values (which differ between runs)."""
    return {k: v for k, v in record.items() if not k.startswith("timing/")}


def run_module(
    module: str, *args: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m areal_m2po.<module> *args`` in ``cwd`` (``TIMEOUT_S`` at most); stdout and
    stderr captured apart."""
    return subprocess.run(
        [sys.executable, "-m", f"areal_m2po.{module}", *args],
        cwd=cwd,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def only_error_line(proc: subprocess.CompletedProcess, status: int = 2) -> str:
    """A run stopped at start-up: ``status`` and stderr that is one ``error:`` line alone (no
    model loading, no traceback); that line."""
    assert proc.returncode == status, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]
