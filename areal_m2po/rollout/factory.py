"""The executor and engine the config asks for: the only place that knows the mode.

``rollout.mode=sync``: :class:`~areal_m2po.rollout.engines.hf.HFInProcessEngine` (a copy of the
policy in this process) under :class:`~areal_m2po.rollout.sync_executor.SyncRolloutExecutor`.
``rollout.mode=async``: :class:`~areal_m2po.rollout.remote_engine.RemoteSGLangEngine` (the
servers of ``rollout.server_addrs``, or ``rollout.n_servers`` started here) under
:class:`~areal_m2po.rollout.async_executor.AsyncRolloutExecutor`; no copy of the policy is
kept in this process (weights go to the servers through disk).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.executor import RolloutExecutor, RolloutSetup
from areal_m2po.rollout.rewards import RewardSources
from areal_m2po.rollout.workflows import build_workflow

__all__ = ["RolloutParts", "build_rollout", "eos_token_ids"]


@dataclass
class RolloutParts:
    """What the trainer has built that the rollout needs.

    Args:
        tokenizer: the policy's tokenizer.
        loader: the prompt loader (``next_batch() -> (records, epoch)``).
        reward: the reward sources.
        output_dir: the run directory (async: ``rollout_weights/``, ``logs/``).
        rank, world: this process and how many there are.
        device: the trainer's device (sync: where generation runs).
        policy_model: sync mode: gives the policy as an unsharded module to copy (called
            once); async mode: unused.
        model_config: the policy's ``transformers`` config (async: saved with the weights).
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


def build_rollout(cfg: PPOConfig, parts: RolloutParts) -> RolloutExecutor:
    """The executor, engine and workflow of ``cfg.rollout`` (the engine not yet started)."""
    roll = cfg.rollout
    if roll.backend == "vllm":
        from areal_m2po.rollout.vllm_factory import build_vllm_engine

        engine: Any = build_vllm_engine(
            cfg, parts.tokenizer, parts.output_dir, parts.world, parts.rank
        )
        eos_ids = eos_token_ids(parts.tokenizer, parts.generation_config)
    elif roll.mode == "async":
        engine = _remote_engine(cfg, parts)
        eos_ids = eos_token_ids(parts.tokenizer, parts.generation_config)
    else:
        from areal_m2po.rollout.engines.hf import HFInProcessEngine

        engine = HFInProcessEngine(parts.policy_model(), parts.tokenizer, parts.device)
        eos_ids = list(engine.eos_ids)
    context = WorkflowContext(
        tokenizer=parts.tokenizer,
        gconfig=cfg.gconfig,
        sampling=SamplingParams.from_gconfig(cfg.gconfig),
        eos_token_ids=eos_ids,
        reward=parts.reward,
    )
    workflow = build_workflow(roll.workflow, roll.workflow_kwargs, context)
    setup = RolloutSetup(
        engine, workflow, context, _pad_id(parts.tokenizer, eos_ids), roll.workflow
    )
    if roll.mode == "async":
        from areal_m2po.rollout.async_executor import AsyncRolloutExecutor
        from areal_m2po.rollout.staleness import StalenessBudget

        n, b = cfg.gconfig.n_samples, cfg.train_dataset.batch_size
        budget = StalenessBudget(
            groups_per_batch=b,
            samples_per_group=n,
            max_head_offpolicyness=roll.max_head_offpolicyness or 0,
            max_concurrent_samples=roll.max_concurrent_rollouts or b * n,
        )
        return AsyncRolloutExecutor(setup, budget, parts.loader.next_batch)
    from areal_m2po.rollout.sync_executor import SyncRolloutExecutor

    return SyncRolloutExecutor(
        setup,
        parts.loader,
        staleness=roll.staleness,
        seed=cfg.seed,
        rank=parts.rank,
        world=parts.world,
    )


def _remote_engine(cfg: PPOConfig, parts: RolloutParts) -> Any:
    from areal_m2po.engine.server_launcher import ServerProcesses
    from areal_m2po.rollout.remote_engine import RemoteEngineOptions, RemoteSGLangEngine

    roll = cfg.rollout
    servers = None
    if roll.server_addrs:
        addrs = list(roll.server_addrs)
    else:
        servers = ServerProcesses(
            roll.n_servers,
            model_path=cfg.actor.path,
            tokenizer_path=cfg.tokenizer_path,
            dtype=cfg.actor.dtype,
            attn_implementation=cfg.actor.attn_implementation,
            num_threads=roll.server_threads,
            log_dir=os.path.join(parts.output_dir, "logs"),
            device=roll.server_device,
            seed=cfg.seed,
        )
        addrs = servers.addrs
    return RemoteSGLangEngine(
        addrs,
        roll.engine_options(RemoteEngineOptions),
        weights_root=os.path.join(parts.output_dir, "rollout_weights"),
        model_config=parts.model_config,
        servers=servers,
    )
