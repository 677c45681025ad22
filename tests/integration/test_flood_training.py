"""Issue 46's done-when, on whole training runs: 1,100 idle loopback connections held against
the agent endpoint (which lives in the trainer) or against an async run's HF rollout server
neither stop the run nor keep its probe from answering within the trainer's 10 s timeout.

Each run is started under the usual 1,024-descriptor limit, hard as well as soft (``ulimit -n
1024``), so neither the trainer nor its servers can raise it out of the flood's reach: before
the connection cap, the agent endpoint's flood ended the run with ``Too many open files`` after
step 1, and the HF server's made ``/health`` time out until the remote engine dropped it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from flood import IdleFlood, raise_own_file_limit
from procs import REPO, process_table, read_metrics, subprocess_env, tiny_train_args

PROBE_TIMEOUT_S = 10.0
"""The trainer's ``/health`` probe timeout (``rollout.health_check_timeout``'s default)."""
STEPS = 3
RUN_TIMEOUT_S = 600
ULIMIT_1024 = ["bash", "-c", 'ulimit -n 1024 && exec "$@"', "bash"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_run(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A tiny training run of :data:`STEPS` steps into ``run_dir`` under a 1,024-descriptor
    limit, its output in ``run_dir.log`` (a file: a full pipe would stall the run)."""
    args = tiny_train_args(run_dir, STEPS, "gconfig.max_new_tokens=6", *extra)
    with open(f"{run_dir}.log", "w") as log:
        return subprocess.Popen(
            [*ULIMIT_1024, sys.executable, "-m", "areal_m2po.train", *args],
            cwd=REPO,
            env={**subprocess_env(), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _wait_listening(port: int, proc: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, "the run ended before its server listened"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"nothing listened on port {port}"
        time.sleep(0.2)


def _steps(run_dir: Path) -> int:
    """Steps recorded in the run's metrics so far."""
    return len(read_metrics(run_dir, missing_ok=True))


def _flood_until_done(
    proc: subprocess.Popen,
    run_dir: Path,
    port: int,
    path: str,
    status: int,
    gate: Path | None = None,
) -> IdleFlood:
    """Hold the flood on ``port`` until the run ends (opening ``gate`` once it is in place),
    probing ``path`` every 2 s over a new connection (as the trainer's monitor may); each probe
    made while the run was alive must answer ``status`` within :data:`PROBE_TIMEOUT_S`.
    Returns the stopped flood."""
    answered, deadline = 0, time.monotonic() + RUN_TIMEOUT_S
    with IdleFlood(port) as flood:
        assert flood.max_held == 1100, flood.max_held
        assert proc.poll() is None, "the run ended before the flood was in place"
        if gate is not None:
            gate.touch()
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"the run did not end within {RUN_TIMEOUT_S}s"
            try:
                with httpx.Client(timeout=PROBE_TIMEOUT_S) as probe:
                    code = probe.get(f"http://127.0.0.1:{port}{path}").status_code
            except httpx.HTTPError as exc:
                if proc.poll() is not None or _steps(run_dir) == STEPS:
                    break  # the run ended, or trained its last step and closes its server
                pytest.fail(
                    f"{path} did not answer within {PROBE_TIMEOUT_S}s under the flood: {exc!r}"
                )
            assert code == status, code
            answered += 1
            time.sleep(2)
    assert answered >= 1, "the run ended before any probe under the flood"
    return flood


def _check_run(proc: subprocess.Popen, run_dir: Path) -> None:
    proc.wait(timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, Path(f"{run_dir}.log").read_text()[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_agent_run_survives_1100_idle_connections_to_its_endpoint(tmp_path):
    raise_own_file_limit(1300)
    port, run_dir, gate = _free_port(), tmp_path / "run", tmp_path / "gate"
    proc = _start_run(
        run_dir,
        "rollout.workflow=areal_m2po.rollout.workflows.agent.workflow:AgentWorkflow",
        f"rollout.workflow_kwargs={{agent: 'toy_agents:gated_two_turn_agent', port: {port}}}",
        env={"AGENT_GATE": str(gate)},
    )
    try:
        _wait_listening(port, proc)  # the endpoint starts with the first episode
        # every call of the run is made under the flood: the agent waits for the gate
        flood = _flood_until_done(proc, run_dir, port, "/sessions/none/v1/models", 404, gate)
        assert flood.opens >= 1100
        _check_run(proc, run_dir)
    finally:
        proc.kill()
        proc.wait()


def _server_port(parent_pid: int, timeout_s: float = 120) -> int:
    """The ``--port`` of the HF rollout server started by process ``parent_pid``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, argv, state, _ in process_table():
            if (
                state != "Z"
                and b"areal_m2po.rollout_server" in argv
                and b"--parent-pid" in argv
                and argv[argv.index(b"--parent-pid") + 1] == str(parent_pid).encode()
            ):
                return int(argv[argv.index(b"--port") + 1])
        time.sleep(0.2)
    raise AssertionError(f"no rollout server of process {parent_pid} appeared")


@pytest.mark.slow
def test_async_run_survives_1100_idle_connections_to_its_server(tmp_path):
    raise_own_file_limit(1300)
    run_dir, gate = tmp_path / "run", tmp_path / "gate"
    proc = _start_run(
        run_dir,
        "rollout.mode=async",
        "rollout.staleness=0",
        "rollout.max_head_offpolicyness=1",
        "rollout.server_threads=1",
        # step 1 waits for the flood: its rewards wait for the gate
        "reward.path=toy_rewards:gated_digit_fraction",
        "reward.timeout_s=300",
        env={"REWARD_GATE": str(gate)},
    )
    try:
        port = _server_port(proc.pid)  # bash exec'd the trainer: the same pid
        _wait_listening(port, proc)
        _flood_until_done(proc, run_dir, port, "/health", 200, gate)
        _check_run(proc, run_dir)
    finally:
        proc.kill()
        proc.wait()
