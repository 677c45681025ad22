"""Every server the trainer starts (HF rollout servers, vLLM servers), and making sure none
outlives it.

Each server is a child process in a session (process group) of its own, so a terminal's Ctrl-C
reaches only the trainer, which stops its servers itself. No server is left behind:
:meth:`ServerProcesses.stop` (called by the engine's ``destroy``, and at exit) signals each
server's whole process group (vLLM's API server and its engine core); each server runs a
watchdog on the trainer's pid (:mod:`.watchdog`); and with ``die_with_parent`` the kernel
sends SIGKILL to a server whose trainer died (``PR_SET_PDEATHSIG``, Linux; for single-process
servers only, since it would orphan a server's own children).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from areal_m2po.utils.net import free_port

__all__ = ["ServerProcesses"]

_PR_SET_PDEATHSIG = 1

Command = Callable[[int, int], list[str]]
"""``command(index, port)``: the argv of server ``index`` listening on ``port``."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerProcesses:
    """``n`` servers on free localhost ports, started now.

    Args:
        n: servers to start.
        command: the argv of each (:data:`Command`).
        env: their environment.
        log_dir: server ``i`` writes stdout and stderr to ``log_dir/<log_name>_<i>.log``.
        log_name: the log files' stem (``rollout_server``, ``vllm_server``).
        label: what a server is called in messages (``vLLM server``).
        die_with_parent: ``PR_SET_PDEATHSIG`` (single-process servers only).
    """

    def __init__(
        self,
        n: int,
        command: Command,
        env: dict[str, str],
        log_dir: str,
        log_name: str,
        label: str,
        die_with_parent: bool = False,
    ) -> None:
        self.label = label
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addrs: list[str] = []
        self.logs: list[str] = []
        os.makedirs(log_dir, exist_ok=True)
        atexit.register(self.stop)
        for i in range(n):
            port = free_port()
            log = os.path.join(log_dir, f"{log_name}_{i}.log")
            with open(log, "ab") as fh:
                proc = subprocess.Popen(
                    command(i, port),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if die_with_parent else None,
                )
            self.procs.append(proc)
            self.addrs.append(f"127.0.0.1:{port}")
            self.logs.append(log)

    def exit_reason(self, addr: str) -> str | None:
        """A one-line reason when the server at ``addr`` has exited, else None."""
        for proc, a, log in zip(self.procs, self.addrs, self.logs):
            if a == addr and proc.poll() is not None:
                return f"{self.label} exited with status {proc.returncode} (log: {log})"
        return None

    def check_alive(self) -> None:
        """Raise RuntimeError naming the first server that exited."""
        for addr in self.addrs:
            reason = self.exit_reason(addr)
            if reason:
                raise RuntimeError(f"rollout server {addr}: {reason}")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM each server's process group, SIGKILL what is left after ``grace_s``;
        idempotent."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # what ignored SIGTERM, children included
            proc.wait()
        atexit.unregister(self.stop)
