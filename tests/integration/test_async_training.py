"""rollout.mode=async end to end on the tiny model: servers as child processes, weights handed
over through disk each step, faults reported in one line, no server process left behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from procs import process_table, read_metrics, spawn_train, tiny_train_args

from areal_m2po.api.cli_args import ConfigError, RolloutConfig
from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.servers.launch import HFServerOptions, start_hf_servers


def _server_pids(parent_pid: int) -> list[int]:
    """Rollout servers in the process table whose ``--parent-pid`` is ``parent_pid``."""
    return [
        pid
        for pid, argv, state, _ in process_table()
        if state != "Z"
        and b"areal_m2po.rollout_server" in argv
        and b"--parent-pid" in argv
        and argv[argv.index(b"--parent-pid") + 1] == str(parent_pid).encode()
    ]


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _metrics(run_dir):
    """The run's metrics so far ([] before its first step)."""
    return read_metrics(run_dir, missing_ok=True)


def _args(run_dir, steps, *extra):
    async_mode = (
        "rollout.mode=async",
        "rollout.staleness=0",
        "rollout.max_head_offpolicyness=1",
        "rollout.server_threads=1",
        "rollout.health_check_interval=0.5",
        "rollout.health_check_timeout=5",
    )
    return tiny_train_args(run_dir, steps, *async_mode, *extra)


def test_config_checks():
    with pytest.raises(ConfigError, match="staleness: must be 0 in async mode"):
        RolloutConfig(mode="async", staleness=1)
    with pytest.raises(ConfigError, match="server_addrs: 'localhost' is not host:port"):
        RolloutConfig(mode="async", server_addrs=["localhost"])
    with pytest.raises(ConfigError, match="mode"):
        RolloutConfig(mode="remote")
    with pytest.raises(ConfigError, match="server_device: must be auto, cpu, cuda or cuda:N"):
        RolloutConfig(mode="async", server_device="gpu1")
    RolloutConfig(mode="async", server_device="cuda:1")
    RolloutConfig(mode="async", max_head_offpolicyness=2, server_addrs=["127.0.0.1:30000"])


@pytest.mark.parametrize("n_servers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_async_training_run(tmp_path, n_servers):
    run_dir = str(tmp_path / "run")
    proc = spawn_train(_args(run_dir, 2, f"rollout.n_servers={n_servers}"))
    try:
        _, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/n_servers"] == n_servers
        assert r["actor/version"] - r["rollout/version_min"] <= 1  # max_head_offpolicyness
    assert rows[0]["rollout/version_max"] == 0  # nothing newer existed at step 1
    assert os.path.isdir(os.path.join(run_dir, "rollout_weights", "v2"))
    assert not os.path.exists(os.path.join(run_dir, "rollout_weights", "v0"))  # pruned
    assert _server_pids(proc.pid) == []


def test_killed_server_gives_one_line_error(tmp_path):
    servers = start_hf_servers(1, HFServerOptions("builtin:tiny", num_threads=1), str(tmp_path))
    try:
        addr = servers.addrs[0]
        run_dir = str(tmp_path / "run")
        args = _args(
            run_dir,
            200,
            f"rollout.server_addrs=[{addr}]",
            "recover.mode=auto",
            "recover.freq_steps=1",
        )
        proc = spawn_train(args)
        try:
            _wait_for(
                lambda: len(_metrics(run_dir)) >= 2 or proc.poll() is not None, 300, "2 steps"
            )
            servers.procs[0].kill()
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        last = err.strip().splitlines()[-1]
        assert proc.returncode == 1, err[-3000:]
        assert last.startswith(f"error: rollout server {addr}"), last
        assert "the last good recover checkpoint is " in last and "step_" in last
    finally:
        servers.stop()


@pytest.mark.parametrize(
    "sig", [signal.SIGKILL, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)]
)
def test_no_server_outlives_the_trainer(tmp_path, sig):
    run_dir = str(tmp_path / "run")
    proc = spawn_train(_args(run_dir, 200))
    try:
        _wait_for(lambda: len(_metrics(run_dir)) >= 1 or proc.poll() is not None, 300, "a step")
        assert proc.poll() is None
        pids = _server_pids(proc.pid)
        assert len(pids) == 1  # the trainer's server is in the process table
        proc.send_signal(sig)
        proc.communicate(timeout=120)
        if sig == signal.SIGTERM:
            assert proc.returncode == 143  # checkpoint, then the status of a SIGTERM
        _wait_for(lambda: not any(os.path.exists(f"/proc/{p}/cmdline") and _alive(p) for p in pids),
                  30, "the servers to exit")  # fmt: skip
    finally:
        proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_resume_restarts_generation_at_the_checkpoint_version(tmp_path):
    """A resumed async run has its servers load the checkpoint's weights first: the first batch
    after resuming from step 2 is generated by version 2, never by the initial weights."""
    run_dir = str(tmp_path / "run")
    recover = ["recover.mode=auto", "recover.freq_steps=1"]
    for steps in (2, 3):
        proc = spawn_train(_args(run_dir, steps, *recover))
        try:
            _, err = proc.communicate(timeout=400)
        finally:
            proc.kill()
        assert proc.returncode == 0, err[-3000:]
    rows = _metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["actor/version"] == 2
    assert rows[2]["rollout/version_min"] == rows[2]["rollout/version_max"] == 2


@pytest.mark.slow
def test_hung_server_is_detected_by_health_checks(tmp_path):
    """A server that stops answering (SIGSTOP) is declared dead by the /health probes long
    before its request would time out, with one line naming it."""
    from areal_m2po.rollout.engines.remote.base import PROBES_TO_DROP, RemoteEngineOptions
    from areal_m2po.rollout.engines.remote.errors import RolloutServerError
    from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine

    servers = start_hf_servers(1, HFServerOptions("builtin:tiny", num_threads=1), str(tmp_path))
    addr, pid = servers.addrs[0], servers.procs[0].pid
    remote = None
    try:
        import httpx

        def healthy():
            servers.check_alive()
            try:
                return httpx.get(f"http://{addr}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        _wait_for(healthy, 120, "the server")
        engine = RemoteSGLangEngine(
            [addr],
            RemoteEngineOptions(
                request_timeout=600, health_check_interval=0.2, health_check_timeout=1.0
            ),
        )
        engine.initialize()  # reaches the server, starts the health monitor
        remote = engine
        os.kill(pid, signal.SIGSTOP)
        request = ModelRequest([5, 6], SamplingParams(max_new_tokens=4))
        with pytest.raises(RolloutServerError) as info:
            asyncio.run(engine.agenerate(request))
        assert str(info.value) == (
            f"rollout server {addr}: did not answer /health within 1s, "
            f"{PROBES_TO_DROP} probes in a row"
        )
        with pytest.raises(RolloutServerError):  # and it stays failed
            engine.check_health()
    finally:
        os.kill(pid, signal.SIGCONT)
        if remote is not None:
            remote.destroy()
        servers.stop()
