"""Start vLLM servers on localhost, each in a session of its own, and stop every one of them.

Each server is ``python -m areal_m2po.rollout.vllm_server_main --parent-pid <trainer> --
<vLLM args>`` (vLLM's OpenAI-compatible server plus a watchdog), started with the vLLM
environment of :func:`~areal_m2po.rollout.engines.vllm.setup.vllm_env`, ``VLLM_SERVER_DEV_MODE=1``
(the pause/resume, ``/collective_rpc`` and weight-version endpoints), the token-in/token-out
``/inference/v1/generate`` endpoint (``--enable-scale-out``) and the weight-reload worker
extension (:mod:`.vllm_worker_ext`). The Python interpreter may be another environment's
(``rollout.vllm.python``), since vLLM's pins may conflict with the trainer's.

No orphan: :meth:`VLLMServerProcesses.stop` (also at exit) kills each server's process group
(API server and engine core), and the watchdog kills the group when the trainer is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from areal_m2po.engine.server_launcher import free_port
from areal_m2po.rollout.engines.vllm.setup import VLLMModelOptions, vllm_env

__all__ = ["VLLMServerOptions", "VLLMServerProcesses", "server_command"]

WORKER_EXTENSION = "areal_m2po.rollout.vllm_worker_ext.WeightReloadExtension"


@dataclass(frozen=True, kw_only=True)
class VLLMServerOptions(VLLMModelOptions):
    """How each server is started (the ``rollout.vllm.*`` keys): the
    :class:`~.vllm_setup.VLLMModelOptions` (as vLLM's ``--dtype``, ``--max-model-len``,
    ``--seed``: server ``i`` gets ``seed * 1000 + i``, and ``--gpu-memory-utilization``) and

    Args:
        model_path: a Hugging Face model directory.
        tokenizer_path: the tokenizer (None: ``model_path``).
        python: the interpreter that runs the servers (None: this one).
        extra_args: more vLLM server arguments, appended as given.
    """

    model_path: str
    tokenizer_path: str | None = None
    gpu_memory_utilization: float = 0.9
    python: str | None = None
    extra_args: tuple[str, ...] = ()


def server_command(o: VLLMServerOptions, port: int, index: int, on_gpu: bool) -> list[str]:
    """The command line of server ``index`` on ``port``."""
    cmd = [o.python or sys.executable, "-m", "areal_m2po.rollout.vllm_server_main"]
    cmd += ["--parent-pid", str(os.getpid()), "--"]
    cmd += ["--model", o.model_path, "--tokenizer", o.tokenizer_path or o.model_path]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", o.dtype]
    cmd += ["--max-model-len", str(o.max_model_len), "--seed", str(o.seed * 1000 + index)]
    cmd += ["--logprobs-mode", "processed_logprobs", "--enable-scale-out"]
    cmd += ["--worker-extension-cls", WORKER_EXTENSION, "--disable-log-stats"]
    if on_gpu:
        cmd += ["--gpu-memory-utilization", str(o.gpu_memory_utilization)]
    else:  # compiled mode took ~100 s to start on CPU and was no faster
        cmd += ["--enforce-eager"]
    return cmd + list(o.extra_args)


class VLLMServerProcesses:
    """``n`` vLLM servers on free localhost ports; logs to ``log_dir/vllm_server_<i>.log``."""

    def __init__(self, n: int, options: VLLMServerOptions, log_dir: str, on_gpu: bool) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.addrs: list[str] = []
        self.logs: list[str] = []
        os.makedirs(log_dir, exist_ok=True)
        atexit.register(self.stop)
        env = vllm_env(options.num_threads, options.kv_cache_gib, in_process=False)
        env["VLLM_SERVER_DEV_MODE"] = "1"
        # CPU: vLLM's sampler torch.compiles a helper (token ranks of the log-probs); that
        # compiles C++ at the first request, which hung past vLLM's RPC timeout on this
        # loaded 2-core machine. Eager is exact and costs nothing measurable here.
        if not on_gpu:
            env.setdefault("TORCHDYNAMO_DISABLE", "1")
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the API server needs its engine core
        for i in range(n):
            port = free_port()
            log = os.path.join(log_dir, f"vllm_server_{i}.log")
            with open(log, "ab") as fh:
                proc = subprocess.Popen(
                    server_command(options, port, i, on_gpu),
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
            self.procs.append(proc)
            self.addrs.append(f"127.0.0.1:{port}")
            self.logs.append(log)

    def exited(self, addr: str) -> str | None:
        """A one-line reason when the server at ``addr`` has exited, else None."""
        for proc, a, log in zip(self.procs, self.addrs, self.logs):
            if a == addr and proc.poll() is not None:
                return f"vLLM server {addr} exited with status {proc.returncode} (log: {log})"
        return None

    def check_alive(self) -> None:
        """Raise RuntimeError naming the first server that exited."""
        for addr in self.addrs:
            reason = self.exited(addr)
            if reason:
                raise RuntimeError(reason)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM each server's process group, SIGKILL what is left after ``grace_s``."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the engine core too
            proc.wait()
        atexit.unregister(self.stop)
