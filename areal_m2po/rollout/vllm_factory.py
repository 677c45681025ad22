"""The vLLM engine ``rollout.backend: vllm`` asks for: in process or servers (rollout.vllm)."""

from __future__ import annotations

import os
from typing import Any

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.api.engine_api import InferenceEngine
from areal_m2po.engine.builtin_models import resolve_model_path

__all__ = ["build_vllm_engine"]


def build_vllm_engine(
    cfg: PPOConfig, tokenizer: Any, output_dir: str, world: int = 1, rank: int = 0
) -> InferenceEngine:
    """The engine of ``cfg.rollout.vllm`` (not yet initialized) for trainer process ``rank``
    of ``world``: in process, each process has its own engine (its own GPU share); servers are
    shared by all processes, and rank 0 drives them (starts them, pushes the weights)."""
    roll, v = cfg.rollout, cfg.rollout.vllm
    model_path = resolve_model_path(cfg.actor.path)
    tok_path = resolve_model_path(cfg.tokenizer_path) if cfg.tokenizer_path else model_path
    max_len = v.max_model_len or cfg.train_dataset.max_prompt_length + cfg.gconfig.max_new_tokens
    # the VLLMModelOptions both placements share (threads and GPU share are placement's own)
    model: dict[str, Any] = {
        "dtype": v.dtype or cfg.actor.dtype,
        "max_model_len": max_len,
        "seed": cfg.seed,
        "kv_cache_gib": v.kv_cache_gib,
    }
    if roll.vllm_placement == "in_process":
        from areal_m2po.rollout.engines.vllm.in_process import (
            VLLMEngineOptions,
            VLLMInProcessEngine,
        )

        options = VLLMEngineOptions(
            **model,
            num_threads=cfg.num_threads,
            gpu_memory_utilization=v.gpu_memory_utilization or 0.3,
            enable_sleep_mode=v.enable_sleep_mode,
        )
        return VLLMInProcessEngine(model_path, tokenizer, tok_path, options)
    from areal_m2po.rollout.vllm_server_engine import VLLMServerEngine, VLLMServerEngineOptions
    from areal_m2po.rollout.vllm_servers import VLLMServerOptions

    servers = None
    if not roll.server_addrs:
        servers = VLLMServerOptions(
            **model,
            model_path=model_path,
            tokenizer_path=tok_path,
            num_threads=roll.server_threads,
            gpu_memory_utilization=v.gpu_memory_utilization or 0.9,
            python=v.python,
            extra_args=tuple(v.server_args or ()),
        )
    weights_root = os.path.join(output_dir, "rollout_weights")
    options = roll.engine_options(VLLMServerEngineOptions, weights_root=weights_root)
    return VLLMServerEngine(
        tokenizer,
        model_path,
        options,
        addrs=list(roll.server_addrs) if roll.server_addrs else None,
        servers=servers,
        n_servers=roll.n_servers,
        log_dir=os.path.join(output_dir, "logs"),
        rank=rank,
        world=world,
    )
