"""The executor and engine the config asks for: the only place that reads ``rollout.mode`` and
``rollout.backend``.

=================  =========================================  ==================================
backend / mode     engine                                     executor
=================  =========================================  ==================================
hf, sync           :class:`~.engines.hf.HFInProcessEngine`    :class:`~.sync_executor.
                   (the policy in this process)               SyncRolloutExecutor`
hf, async          :class:`~.engines.remote.sglang.           :class:`~.async_executor.
                   RemoteSGLangEngine` (``server_addrs``, or  AsyncRolloutExecutor`
                   ``n_servers`` HF rollout servers started
                   by rank 0; weights through disk)
vllm, in_process   :class:`~.engines.vllm.in_process.         the mode's
                   VLLMInProcessEngine`
vllm, servers      :class:`~.engines.remote.vllm.             the mode's
                   RemoteVLLMEngine`
=================  =========================================  ==================================

Servers started here are started now (rank 0), so they load while the trainer builds its
models; the engine waits for them at ``initialize``. They take a key generated for this run
(:func:`server_api_key`) and load weights only from the run's ``rollout_weights/``; servers
elsewhere (``rollout.server_addrs``) take the key the user gives.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.api.engine_api import InferenceEngine, SamplingParams
from areal_m2po.api.workflow_api import RolloutWorkflow, WorkflowContext
from areal_m2po.engine.builtin_models import resolve_model_path
from areal_m2po.rollout.executor import RolloutExecutor, RolloutSetup
from areal_m2po.rollout.rewards import RewardSources
from areal_m2po.rollout.workflows import build_workflow
from areal_m2po.utils.dist import broadcast_object

__all__ = [
    "RolloutParts",
    "build_rollout",
    "eos_token_ids",
    "run_server_key",
    "server_api_key",
    "vllm_max_model_len",
]


@dataclass
class RolloutParts:
    """What the trainer has built that the rollout needs.

    Args:
        tokenizer: the policy's tokenizer.
        loader: the prompt loader (``next_batch() -> (records, epoch)``).
        reward: the reward sources.
        output_dir: the run directory (servers: ``rollout_weights/``, ``logs/``).
        rank, world: this process and how many there are.
        device: the trainer's device (sync: where generation runs).
        policy_model: sync mode with the HF backend: gives the policy as an unsharded module
            to copy (called once); otherwise unused.
        share_policy: the module ``policy_model`` gives is the trainer's own, updated in place:
            the HF engine generates from it without a copy (sync mode only).
        model_config: the policy's ``transformers`` config (saved with the weights).
        generation_config: the policy's generation config (its EOS ids end completions too).
    """

    tokenizer: Any
    loader: Any
    reward: RewardSources
    output_dir: str
    rank: int
    world: int
    device: torch.device
    policy_model: Callable[[], torch.nn.Module]
    model_config: Any
    generation_config: Any = None
    share_policy: bool = False
    workflow: Callable[[WorkflowContext], RolloutWorkflow] | None = None
    """Builds the workflow from its context instead of ``rollout.workflow`` (a trainer built
    from Python with a workflow object); None: the config's."""


def eos_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The tokenizer's EOS id(s) plus those of the model's generation config."""
    eos = tokenizer.eos_token_id
    ids = [int(t) for t in eos] if isinstance(eos, (list, tuple)) else [int(eos)]
    extra = getattr(generation_config, "eos_token_id", None)
    for t in extra if isinstance(extra, (list, tuple)) else [extra]:
        if t is not None and int(t) not in ids:
            ids.append(int(t))
    return ids


def _pad_id(tokenizer: Any, eos_ids: list[int]) -> int:
    pad = tokenizer.pad_token_id
    return int(pad) if pad is not None else eos_ids[0]


def vllm_max_model_len(cfg: PPOConfig) -> int:
    """The context length vLLM reserves for: ``rollout.vllm.max_model_len``, else the episode
    budget (``rollout.max_episode_tokens`` as set or derived), so no episode outgrows it."""
    return cfg.rollout.vllm.max_model_len or cfg.episode_budget


def check_model_positions(cfg: PPOConfig, model_config: Any) -> None:
    """ConfigError when the episode budget exceeds the policy's ``max_position_embeddings``
    (read from its loaded config: models the start-up check could not read, e.g. builtin:),
    by the one rule :meth:`PPOConfig.check_model_positions`."""
    positions = getattr(model_config, "max_position_embeddings", None)
    cfg.check_model_positions(positions, cfg.actor.path)


def build_rollout(cfg: PPOConfig, parts: RolloutParts) -> RolloutExecutor:
    """The executor, engine and workflow of ``cfg.rollout`` (the engine not yet started)."""
    roll = cfg.rollout
    check_model_positions(cfg, parts.model_config)
    engine: InferenceEngine
    if roll.backend == "vllm":
        engine = _vllm_engine(cfg, parts)
        eos_ids = eos_token_ids(parts.tokenizer, parts.generation_config)
    elif roll.mode == "async":
        engine = _remote_hf_engine(cfg, parts)
        eos_ids = eos_token_ids(parts.tokenizer, parts.generation_config)
    else:
        from areal_m2po.rollout.engines.hf import HFInProcessEngine

        hf = HFInProcessEngine(
            parts.policy_model(), parts.tokenizer, parts.device, share=parts.share_policy
        )
        if not torch.cuda.is_available():
            # the trainer waits while this engine samples: heaps without page faults then
            # cost no peak (run_setup applies cfg.host_mmap_threshold_mib where CUDA is not)
            hf.generator.restore_mmap_threshold_mib = cfg.host_mmap_threshold_mib
        engine, eos_ids = hf, list(hf.eos_ids)
    context = WorkflowContext(
        tokenizer=parts.tokenizer,
        gconfig=cfg.gconfig,
        sampling=SamplingParams.from_gconfig(cfg.gconfig),
        eos_token_ids=eos_ids,
        reward=parts.reward,
        max_episode_tokens=cfg.episode_budget,
        agent_config=roll.agent,
    )
    if parts.workflow is not None:
        workflow = parts.workflow(context)
    else:
        workflow = build_workflow(roll.workflow, roll.workflow_kwargs, context)
    # a workflow given from Python is named by itself in the executor's one-line errors
    name = roll.workflow if parts.workflow is None else getattr(workflow, "name", "workflow")
    setup = RolloutSetup(
        engine,
        workflow,
        context,
        _pad_id(parts.tokenizer, eos_ids),
        name,
        roll.episode_timeout_s,
    )
    if roll.mode == "async":
        from areal_m2po.rollout.async_executor import AsyncRolloutExecutor
        from areal_m2po.rollout.staleness import StalenessBudget

        # each process generates and trains its contiguous share of every batch's groups
        n, b = cfg.gconfig.n_samples, cfg.train_dataset.batch_size // parts.world
        concurrent = (roll.max_concurrent_rollouts or b * n * parts.world) // parts.world
        budget = StalenessBudget(
            groups_per_batch=b,
            samples_per_group=n,
            max_head_offpolicyness=roll.max_head_offpolicyness or 0,
            max_concurrent_samples=max(concurrent, n),
        )
        return AsyncRolloutExecutor(setup, budget, parts.loader.next_batch, parts.rank, parts.world)
    from areal_m2po.rollout.sync_executor import SyncRolloutExecutor

    return SyncRolloutExecutor(
        setup,
        parts.loader,
        staleness=roll.staleness,
        seed=cfg.seed,
        rank=parts.rank,
        world=parts.world,
    )


def server_api_key(cfg: PPOConfig, starts_servers: bool) -> str | None:
    """The servers' key: ``rollout.server_api_key`` (else ``AREAL_M2PO_SERVER_API_KEY``);
    for servers started here without one, a new key for this run."""
    given = cfg.rollout.api_key()
    if given is None and starts_servers:
        return secrets.token_urlsafe(32)
    return given


def run_server_key(cfg: PPOConfig, parts: RolloutParts) -> str | None:
    """The key every trainer process sends to the rollout servers: the given one, else the new
    key of the servers trainer rank 0 starts, broadcast so that every rank reaches them."""
    starts = not cfg.rollout.server_addrs
    key = server_api_key(cfg, starts_servers=starts and parts.rank == 0)
    if starts and parts.world > 1:
        key = broadcast_object(key)
    return key


def _weights_root(parts: RolloutParts) -> str:
    return os.path.join(os.path.abspath(parts.output_dir), "rollout_weights")


def _remote_options(cfg: PPOConfig, parts: RolloutParts, api_key: str | None, limits: Any) -> Any:
    from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions

    return cfg.rollout.engine_options(
        RemoteEngineOptions, weights_root=_weights_root(parts), api_key=api_key,
        request_limits=limits,
    )  # fmt: skip


def _model_limits(model_config: Any, context_len: int | None, name: str, capped: bool) -> Any:
    """What every request to servers of this policy must fit (vocabulary, context)."""
    from areal_m2po.rollout.engines.request_limits import RequestLimits

    vocab = getattr(model_config, "vocab_size", None)
    return RequestLimits(vocab if isinstance(vocab, int) else None, context_len, name, capped)


def _remote_hf_engine(cfg: PPOConfig, parts: RolloutParts) -> InferenceEngine:
    """HF rollout servers (``rollout.server_addrs``, or ``rollout.n_servers`` started here)
    behind the SGLang-protocol engine."""
    from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine
    from areal_m2po.rollout.servers.launch import HFServerOptions, start_hf_servers

    roll = cfg.rollout
    processes = None
    api_key = run_server_key(cfg, parts)
    if not roll.server_addrs and parts.rank == 0:
        options = HFServerOptions(
            model_path=cfg.actor.path,
            tokenizer_path=cfg.tokenizer_path,
            dtype=cfg.actor.dtype,
            attn_implementation=cfg.actor.attn_implementation,
            num_threads=roll.server_threads,
            device=roll.server_device,
            seed=cfg.seed,
            weights_root=_weights_root(parts),
        )
        processes = start_hf_servers(
            roll.n_servers, options, os.path.join(parts.output_dir, "logs"), api_key
        )
    positions = getattr(parts.model_config, "max_position_embeddings", None)
    limits = _model_limits(
        parts.model_config,
        positions if isinstance(positions, int) else None,
        "the policy's max_position_embeddings",
        capped=False,
    )
    return RemoteSGLangEngine(
        list(roll.server_addrs) if roll.server_addrs else None,
        _remote_options(cfg, parts, api_key, limits),
        processes=processes,
        model_config=parts.model_config,
        rank=parts.rank,
        world=parts.world,
    )


def _vllm_engine(cfg: PPOConfig, parts: RolloutParts) -> InferenceEngine:
    """The engine of ``cfg.rollout.vllm`` for trainer process ``parts.rank``: in process,
    each process has its own engine (its own GPU share); servers are shared by all processes,
    and rank 0 starts and drives them."""
    roll, v = cfg.rollout, cfg.rollout.vllm
    model_path = resolve_model_path(cfg.actor.path)
    tok_path = resolve_model_path(cfg.tokenizer_path) if cfg.tokenizer_path else model_path
    max_len = vllm_max_model_len(cfg)
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
        return VLLMInProcessEngine(model_path, parts.tokenizer, tok_path, options)
    from areal_m2po.rollout.engines.remote.vllm import RemoteVLLMEngine
    from areal_m2po.rollout.engines.vllm.setup import cuda_available
    from areal_m2po.rollout.servers.launch import VLLMServerOptions, start_vllm_servers

    processes = None
    starts = not roll.server_addrs and parts.rank == 0
    api_key = run_server_key(cfg, parts)
    if starts:
        servers = VLLMServerOptions(
            **model,
            model_path=model_path,
            tokenizer_path=tok_path,
            num_threads=roll.server_threads,
            gpu_memory_utilization=v.gpu_memory_utilization or 0.9,
            python=v.python,
            extra_args=tuple(v.server_args or ()),
            weights_root=_weights_root(parts),
        )
        log_dir = os.path.join(parts.output_dir, "logs")
        processes = start_vllm_servers(roll.n_servers, servers, log_dir, cuda_available(), api_key)
    # vLLM ends a completion that reaches max_model_len itself: only the prompt must fit (the
    # length of servers elsewhere is known only when rollout.vllm.max_model_len says it)
    known = max_len if not roll.server_addrs or v.max_model_len else None
    limits = _model_limits(parts.model_config, known, "rollout.vllm.max_model_len", capped=True)
    return RemoteVLLMEngine(
        parts.tokenizer,
        model_path,
        _remote_options(cfg, parts, api_key, limits),
        addrs=list(roll.server_addrs) if roll.server_addrs else None,
        processes=processes,
        rank=parts.rank,
        world=parts.world,
    )
