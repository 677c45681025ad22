"""The replicated placement: one process, or Accelerate's DDP over several.

Every process holds the whole model, its gradients and its optimizer state; the model and the
optimizer go through ``accelerator.prepare`` (the LR scheduler does not: Accelerate's wrapper
steps it once per process). Gradients are averaged over processes with the last backward of a
step (``accelerator.no_sync`` before it).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from areal_m2po.engine.backends.base import PlacementBackend, Prepared
from areal_m2po.engine.optim import build_optimizer

__all__ = ["DDPBackend"]


class DDPBackend(PlacementBackend):
    """``backend: ddp``: the model replicated on every process (see the module docstring)."""

    name = "ddp"
    sharded = False

    def place(self, raw: torch.nn.Module) -> torch.nn.Module:
        return raw.to(self.device)

    def prepare(self, raw: torch.nn.Module, total_steps: int) -> Prepared:
        optimizer, scheduler = build_optimizer(raw.parameters(), self.config.optimizer, total_steps)
        model, optimizer = self.accelerator.prepare(raw, optimizer)
        return model, optimizer, scheduler

    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        return contextlib.nullcontext() if enabled else self.accelerator.no_sync(model)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        return self.accelerator.clip_grad_norm_(model.parameters(), max_norm)

    def full_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.unwrap(model).state_dict().items())

    def full_state_on_main(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return self.accelerator.get_state_dict(model)

    def plain_copy(self, model: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
        return copy.deepcopy(self.unwrap(model)).to(dtype=dtype)

    def save_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        shard_dir: str | None,
        state: dict[str, Any],
    ) -> None:
        del shard_dir
        state["model"] = self.accelerator.get_state_dict(model)
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()

    def load_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        shard_dir: str | None,
        state: dict[str, Any],
    ) -> None:
        del shard_dir
        self.unwrap(model).load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
