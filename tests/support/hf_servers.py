"""One HF rollout server process for the server tests, started as the trainer starts it.

``start_tiny_hf_server`` launches ``builtin:tiny`` behind :class:`ServerProcesses` (the key, if
any, in its environment and nowhere else) and returns once ``/health`` answers 200;
``wait_healthy`` is that wait alone, for servers started another way.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

START_TIMEOUT_S = 120.0


def wait_healthy(procs, timeout_s: float = START_TIMEOUT_S) -> str:
    """The address of ``procs``' first server once its ``/health`` answers 200; fails the test
    if a server process exits or ``timeout_s`` passes first."""
    addr = procs.addrs[0]
    deadline = time.monotonic() + timeout_s
    while True:
        procs.check_alive()
        try:
            if httpx.get(f"http://{addr}/health", timeout=2).status_code == 200:
                return addr
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.3)


def start_tiny_hf_server(
    base: Path,
    key: str | None = None,
    extra: Sequence[str] = (),
    wrap: Sequence[str] = (),
):
    """``(addr, weights_root, processes)`` of one healthy ``builtin:tiny`` HF server under
    ``base`` (logs in ``base/logs``, weights root ``base/rollout_weights``): its command
    wrapped by ``wrap`` and followed by ``extra``, the API key ``key`` (None: no key) set in its
    environment only."""
    from areal_m2po.rollout.common.guard import API_KEY_ENV
    from areal_m2po.rollout.servers.launch import HFServerOptions, hf_server_command
    from areal_m2po.rollout.servers.processes import ServerProcesses

    root = str(base / "rollout_weights")
    options = HFServerOptions("builtin:tiny", num_threads=1, weights_root=root)
    env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
    if key is not None:
        env[API_KEY_ENV] = key
    procs = ServerProcesses(
        1,
        lambda i, port: [*wrap, *hf_server_command(options, port, i), *extra],
        env,
        str(base / "logs"),
        "rollout_server",
        "HF rollout server",
    )
    return wait_healthy(procs), root, procs
