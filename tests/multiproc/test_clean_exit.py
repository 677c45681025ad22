"""A run leaves its process group in order and its process exits with the run's status.

Each check runs in a fresh interpreter with a one-rank gloo process group (what a multi-process
CPU run has on every rank), so a process-level exit path can be observed from outside:

* ``dist.end_process_group`` ends the group; the gloo worker threads end with it when nothing
  else holds the group, and outlive it when something does (as a DDP-wrapped model does).
* ``dist.exit_status_after_run`` then runs the ``atexit`` handlers and ends the process with
  the run's status without finalising the interpreter (a module-level object's ``__del__``
  never runs), and returns the status for a normal exit when no gloo thread is left.
* (slow) ``scripts/repeat_multiproc_exit.py``: 2-process training runs all exit 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PRELUDE = """
import atexit, sys, tempfile
import torch, torch.distributed as tdist
from areal_m2po.utils import dist
torch.set_num_threads(1)
tdist.init_process_group(
    "gloo", rank=0, world_size=1, init_method="file://" + tempfile.mktemp()
)
tdist.all_reduce(torch.ones(8))
atexit.register(lambda: print("EXIT HANDLERS RAN", flush=True))


class _Teardown:
    def __del__(self):  # module teardown: only while the interpreter finalises
        print("FINALISED", flush=True)


teardown = _Teardown()
print("threads while running", dist.gloo_worker_threads(), flush=True)
"""


def _run(body: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def _threads(out: str, label: str) -> int:
    line = next(x for x in out.splitlines() if x.startswith(label))
    return int(line.rsplit(" ", 1)[1])


def test_end_process_group_joins_gloo_threads_when_nothing_holds_the_group():
    res = _run(
        """
        print("status while initialised", dist.exit_status_after_run(5), flush=True)
        print("ended", dist.end_process_group())
        print("initialised", tdist.is_initialized())
        print("ended again", dist.end_process_group())
        print("threads after end", dist.gloo_worker_threads(), flush=True)
        sys.exit(dist.exit_status_after_run(3))
        """
    )
    assert _threads(res.stdout, "threads while running") > 0, res.stdout + res.stderr
    # a live process group is its owner's to close: the status comes back, nothing ends
    assert "status while initialised 5" in res.stdout
    assert "ended True" in res.stdout and "initialised False" in res.stdout
    assert "ended again False" in res.stdout  # idempotent: close() may run twice
    assert _threads(res.stdout, "threads after end") == 0
    # no gloo thread left: a normal exit, finalisation included
    assert res.returncode == 3
    assert "EXIT HANDLERS RAN" in res.stdout and "FINALISED" in res.stdout


def test_exit_skips_finalisation_when_gloo_threads_outlive_the_group():
    res = _run(
        """
        holder = tdist.group.WORLD  # as a DDP reducer or device mesh holds it
        dist.end_process_group()
        print("threads after end", dist.gloo_worker_threads(), flush=True)
        sys.exit(dist.exit_status_after_run(3))
        """
    )
    assert _threads(res.stdout, "threads after end") > 0, res.stdout + res.stderr
    assert res.returncode == 3
    assert "EXIT HANDLERS RAN" in res.stdout  # atexit handlers (log flushing, servers) ran
    assert "FINALISED" not in res.stdout  # the interpreter was not finalised


def test_entry_point_exit_status_without_torch_distributed_is_the_status():
    from areal_m2po.entry import exit_status

    assert exit_status(0) == 0 and exit_status(2) == 2


@pytest.mark.slow
@pytest.mark.multiproc
def test_repeated_two_process_runs_all_exit_zero():
    script = REPO / "scripts" / "repeat_multiproc_exit.py"
    res = subprocess.run(
        [sys.executable, str(script), "--runs", "3", "--steps", "1"],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    tail = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert tail["runs"] == "3" and tail["exit_0"] == "3"
    assert tail["aborts"] == "0" and tail["left_behind"] == "0"
