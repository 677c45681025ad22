"""Start rollout server processes on localhost and make sure none outlives the trainer.

Each server is a child process in its own session (so a terminal's Ctrl-C reaches only the
trainer, which stops its servers itself). Three layers make sure no server is left behind:
:meth:`ServerProcesses.stop` (called on exit and from an ``atexit`` hook; SIGTERM becomes a
normal exit in the trainer), ``PR_SET_PDEATHSIG`` on Linux (the kernel sends SIGKILL to the
server when the trainer dies, even by SIGKILL), and the server's own ``--parent-pid`` watchdog
(it exits when its parent is gone, on any OS).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["ServerProcesses", "free_port"]

_PR_SET_PDEATHSIG = 1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerProcesses:
    """``n`` rollout servers started with ``python -m areal_m2po.rollout_server``.

    Args:
        n: servers to start.
        model_path, tokenizer_path, dtype, attn_implementation: how each loads the model.
        num_threads: torch CPU threads per server (None: torch's default).
        device: ``--device`` of every server (auto, cpu, cuda, cuda:N).
        seed: server i samples with ``--random-seed seed * 1000 + i``.
        log_dir: each server's stdout/stderr go to ``log_dir/rollout_server_<i>.log``.
    """

    def __init__(
        self,
        n: int,
        model_path: str,
        tokenizer_path: str | None,
        dtype: str,
        attn_implementation: str,
        num_threads: int | None,
        log_dir: str,
        device: str = "auto",
        seed: int = 0,
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addrs: list[str] = []
        self.logs: list[str] = []
        os.makedirs(log_dir, exist_ok=True)
        atexit.register(self.stop)
        for i in range(n):
            port = free_port()
            cmd = [sys.executable, "-m", "areal_m2po.rollout_server", "--model-path", model_path]
            cmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", dtype]
            cmd += ["--attn-implementation", attn_implementation, "--device", device]
            cmd += ["--random-seed", str(seed * 1000 + i)]
            cmd += ["--parent-pid", str(os.getpid())]
            if tokenizer_path:
                cmd += ["--tokenizer-path", tokenizer_path]
            if num_threads:
                cmd += ["--num-threads", str(num_threads)]
            log = os.path.join(log_dir, f"rollout_server_{i}.log")
            env = dict(os.environ)
            if num_threads:
                env["OMP_NUM_THREADS"] = str(num_threads)
            with open(log, "ab") as fh:
                proc = subprocess.Popen(
                    cmd,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            self.procs.append(proc)
            self.addrs.append(f"127.0.0.1:{port}")
            self.logs.append(log)

    def check_alive(self) -> None:
        """Raise RuntimeError naming a server that exited (with its log)."""
        for proc, addr, log in zip(self.procs, self.addrs, self.logs):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"rollout server {addr} exited with status {proc.returncode} (log: {log})"
                )

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate every server (SIGTERM, then SIGKILL after ``grace_s``); idempotent."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        atexit.unregister(self.stop)
