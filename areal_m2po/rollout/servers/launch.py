"""The servers the trainer starts on localhost: their command lines and environments.

* HF rollout servers: ``python -m areal_m2po.rollout_server`` (SGLang's launch flags; the
  in-process HF generation behind SGLang's protocol), one process each.
* vLLM servers: ``python -m areal_m2po.rollout.vllm_server_main --parent-pid <trainer> --
  <vLLM args>`` (vLLM's OpenAI-compatible server plus a watchdog), with the vLLM environment of
  :func:`~areal_m2po.rollout.engines.vllm.setup.vllm_env`, ``VLLM_SERVER_DEV_MODE=1`` (the
  pause/resume, ``/collective_rpc`` and weight-version endpoints), the token-in/token-out
  ``/inference/v1/generate`` endpoint (``--enable-scale-out``) and the weight-reload worker
  extension. The interpreter may be another environment's (``rollout.vllm.python``), since
  vLLM's pins may conflict with the trainer's.

Both are :class:`~.processes.ServerProcesses`, every one of which the trainer stops. Each
gets the run's API key in its environment (``AREAL_M2PO_SERVER_API_KEY``, :mod:`.guard`), never
on its command line (``ps`` shows that to every user, vLLM writes it to its log), and
``--weights-root``, the folder the trainer stages weights in: the only place it loads from.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from areal_m2po.rollout.common.guard import API_KEY_ENV
from areal_m2po.rollout.common.server_args import refused_server_arg
from areal_m2po.rollout.engines.vllm.setup import VLLMModelOptions, vllm_env
from areal_m2po.rollout.servers.processes import ServerProcesses

__all__ = [
    "HFServerOptions",
    "VLLMServerOptions",
    "WORKER_EXTENSION",
    "hf_server_command",
    "start_hf_servers",
    "start_vllm_servers",
    "vllm_server_command",
]

WORKER_EXTENSION = "areal_m2po.rollout.vllm_worker_ext.WeightReloadExtension"
"""The stable ``--worker-extension-cls`` path of the weight-reload extension."""


@dataclass(frozen=True)
class HFServerOptions:
    """How each HF rollout server loads and runs the model.

    Args:
        model_path, tokenizer_path, dtype, attn_implementation: the policy (``actor.*``).
        num_threads: torch CPU threads per server (None: torch's default).
        device: ``--device`` of every server (auto, cpu, cuda, cuda:N).
        seed: server ``i`` samples with ``--random-seed seed * 1000 + i``.
        weights_root: ``--weights-root``, where the trainer stages weights (None: any path).
    """

    model_path: str
    tokenizer_path: str | None = None
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    num_threads: int | None = None
    device: str = "auto"
    seed: int = 0
    weights_root: str | None = None


def hf_server_command(o: HFServerOptions, port: int, index: int) -> list[str]:
    """The command line of HF rollout server ``index`` on ``port``."""
    cmd = [sys.executable, "-m", "areal_m2po.rollout_server", "--model-path", o.model_path]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--dtype", o.dtype]
    cmd += ["--attn-implementation", o.attn_implementation, "--device", o.device]
    cmd += ["--random-seed", str(o.seed * 1000 + index)]
    cmd += ["--parent-pid", str(os.getpid())]
    if o.tokenizer_path:
        cmd += ["--tokenizer-path", o.tokenizer_path]
    if o.num_threads:
        cmd += ["--num-threads", str(o.num_threads)]
    if o.weights_root:
        cmd += ["--weights-root", o.weights_root]
    return cmd


def _with_key(env: dict[str, str], api_key: str | None) -> dict[str, str]:
    env.pop(API_KEY_ENV, None)  # the trainer's own (servers elsewhere) is not theirs
    if api_key:
        env[API_KEY_ENV] = api_key
    return env


def start_hf_servers(
    n: int, options: HFServerOptions, log_dir: str, api_key: str | None = None
) -> ServerProcesses:
    """``n`` HF rollout servers taking ``api_key``; logs ``log_dir/rollout_server_<i>.log``."""
    env = _with_key(dict(os.environ), api_key)
    if options.num_threads:
        env["OMP_NUM_THREADS"] = str(options.num_threads)
    return ServerProcesses(
        n,
        lambda i, port: hf_server_command(options, port, i),
        env,
        log_dir,
        "rollout_server",
        "HF rollout server",
        die_with_parent=True,
    )


@dataclass(frozen=True, kw_only=True)
class VLLMServerOptions(VLLMModelOptions):
    """How each vLLM server is started (the ``rollout.vllm.*`` keys): the
    :class:`~areal_m2po.rollout.engines.vllm.setup.VLLMModelOptions` (as vLLM's ``--dtype``,
    ``--max-model-len``, ``--seed``: server ``i`` gets ``seed * 1000 + i``, and
    ``--gpu-memory-utilization``) and

    Args:
        model_path: a Hugging Face model directory.
        tokenizer_path: the tokenizer (None: ``model_path``).
        python: the interpreter that runs the servers (None: this one).
        extra_args: more vLLM server arguments, appended as given.
        weights_root: ``--weights-root``, where the trainer stages weights (None: any path).
    """

    model_path: str
    tokenizer_path: str | None = None
    gpu_memory_utilization: float = 0.9
    python: str | None = None
    extra_args: tuple[str, ...] = ()
    weights_root: str | None = None


def vllm_server_command(o: VLLMServerOptions, port: int, index: int, on_gpu: bool) -> list[str]:
    """The command line of vLLM server ``index`` on ``port``."""
    cmd = [o.python or sys.executable, "-m", "areal_m2po.rollout.vllm_server_main"]
    cmd += ["--parent-pid", str(os.getpid())]
    if o.weights_root:
        cmd += ["--weights-root", o.weights_root]
    cmd += ["--"]
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


def start_vllm_servers(
    n: int, options: VLLMServerOptions, log_dir: str, on_gpu: bool, api_key: str | None = None
) -> ServerProcesses:
    """``n`` vLLM servers taking ``api_key``; logs ``log_dir/vllm_server_<i>.log``.

    Raises:
        ValueError: an argument of ``options.extra_args`` spells a guarded flag
            (:func:`~areal_m2po.rollout.common.server_args.refused_server_arg`).
    """
    refused = refused_server_arg(options.extra_args)
    if refused is not None:
        raise ValueError(f"rollout.vllm.server_args: {refused}")
    env = _with_key(vllm_env(options.num_threads, options.kv_cache_gib, in_process=False), api_key)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    # CPU: vLLM's sampler torch.compiles a helper (token ranks of the log-probs); that
    # compiles C++ at the first request, which hung past vLLM's RPC timeout on this
    # loaded 2-core machine. Eager is exact and costs nothing measurable here.
    if not on_gpu:
        env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the API server needs its engine core
    return ServerProcesses(
        n,
        lambda i, port: vllm_server_command(options, port, i, on_gpu),
        env,
        log_dir,
        "vllm_server",
        "vLLM server",
    )
