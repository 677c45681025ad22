"""Run the 2-process CPU training of ``configs/tiny.yaml`` N times; count the exit codes.

Run::

    python scripts/repeat_multiproc_exit.py             # 20 runs of 2 steps, ~15 s each
    python scripts/repeat_multiproc_exit.py --runs 5 --steps 1

Each run is ``accelerate launch --multi_gpu --num_processes 2 --cpu``-style (gloo, see
:func:`areal_m2po.utils.dist.cpu_launch_command`) of ``python -m areal_m2po.train`` with the
tiny config, a recover checkpoint every step and the final HF save, so the run ends the way a
user's does. After each run the script checks that no process of it is left: the launcher's
process group (it is started in a new session) must be empty. A worker killed by SIGABRT during
interpreter shutdown shows up as a non-zero launcher exit and an ``abort``/``terminate called``
line in its output.

The last lines are ``name=value``: ``runs``, ``exit_0``, ``exit_nonzero``, ``aborts`` (runs
whose output shows a C++ ``terminate``/``Aborted``), ``left_behind`` (runs leaving a process).
The exit status is 0 only when every run exited 0 and left nothing behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from areal_m2po.utils.dist import cpu_launch_command  # noqa: E402

ABORT_MARKERS = ("terminate called", "Aborted", "SIGABRT", "core dumped", "Signals.SIGABRT")


def train_command(out: Path, steps: int) -> list[str]:
    """The launcher argv of one 2-process tiny run writing into ``out``."""
    return [
        *cpu_launch_command(2),
        "-m",
        "areal_m2po.train",
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        f"output_dir={out}",
        f"total_train_steps={steps}",
        "num_threads=1",
        "recover.mode=auto",
        "recover.freq_steps=1",
    ]


def _group_alive(pgid: int) -> bool:
    """True while any process of process group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_once(out: Path, steps: int, timeout_s: float) -> tuple[int, bool, bool, str]:
    """One run: ``(launcher exit code, abort seen in output, process left behind, output)``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        env[key] = "1"
    env["WANDB_MODE"] = "disabled"
    proc = subprocess.Popen(
        train_command(out, steps),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: every worker is findable afterwards
    )
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -9, False, True, output
    left = False
    for _ in range(50):  # up to 5 s for the workers to be reaped
        if not _group_alive(proc.pid):
            break
        time.sleep(0.1)
    else:
        left = True
        os.killpg(proc.pid, signal.SIGKILL)
    aborted = any(m in output for m in ABORT_MARKERS)
    return proc.returncode, aborted, left, output


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    args = ap.parse_args()
    codes: list[int] = []
    aborts = left_behind = 0
    with tempfile.TemporaryDirectory(prefix="exit-check-") as tmp:
        for i in range(args.runs):
            t0 = time.perf_counter()
            code, aborted, left, output = run_once(Path(tmp) / f"run{i}", args.steps, args.timeout)
            codes.append(code)
            aborts += aborted
            left_behind += left
            print(
                f"run {i + 1}/{args.runs}: exit {code}, abort {aborted}, left behind {left}, "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
            if code != 0 or aborted:
                print(output[-3000:], flush=True)
    n_ok = sum(c == 0 for c in codes)
    print(f"runs={len(codes)}")
    print(f"exit_0={n_ok}")
    print(f"exit_nonzero={len(codes) - n_ok}")
    print(f"aborts={aborts}")
    print(f"left_behind={left_behind}")
    return 0 if n_ok == len(codes) and not left_behind and not aborts else 1


if __name__ == "__main__":
    sys.exit(main())
