"""The sharded placement: PyTorch FSDP2 (``fully_shard``) over all processes.

The model is sharded with :func:`~areal_m2po.engine.fsdp.shard_model` on the process group
Accelerate set up (it never goes through ``accelerator.prepare``) and the optimizer holds this
rank's shards. Every forward and backward is a collective: a rank with fewer micro-batches, or
with a micro-batch that has nothing to score, runs idle forwards (and zero backwards) so that
all ranks stay in step; the forwards of the model are counted for that (a pre-forward hook).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from areal_m2po.engine import fsdp
from areal_m2po.engine.backends.base import PlacementBackend, Prepared
from areal_m2po.engine.optim import build_optimizer
from areal_m2po.engine.precision import TORCH_DTYPES
from areal_m2po.utils import dist

__all__ = ["FSDP2Backend"]


class FSDP2Backend(PlacementBackend):
    """``backend: fsdp2``: 1/N of the parameters, gradients and optimizer state per process
    (see the module docstring)."""

    name = "fsdp2"
    sharded = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.n_forward = 0  # calls of the model's forward (keeps ranks in step)

    def place(self, raw: torch.nn.Module) -> torch.nn.Module:
        fsdp_cfg = self.config.fsdp
        if self.precision.enabled and fsdp_cfg.param_dtype is None:  # compute in float16
            fsdp_cfg = dataclasses.replace(fsdp_cfg, param_dtype="float16")
        model = fsdp.shard_model(raw, fsdp_cfg, self.device)

        def count(*_: Any) -> None:
            self.n_forward += 1

        model.register_forward_pre_hook(count)
        return model

    def prepare(self, raw: torch.nn.Module, total_steps: int) -> Prepared:
        model = self.place(raw)
        optimizer, scheduler = build_optimizer(
            model.parameters(), self.config.optimizer, total_steps
        )
        return model, optimizer, scheduler

    def idle_micro_batches(self, n_local: int) -> int:
        most = int(dist.all_reduce_max(torch.tensor([float(n_local)]))[0])
        return most - n_local

    def forward(
        self, model: torch.nn.Module, run: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``run()``; when it did not call the model (nothing to score), an idle forward tied
        to its output, so that the backward runs the gradient reduce-scatter with the others."""
        before = self.n_forward
        out, aux = run()
        if self.n_forward == before:
            out = out + fsdp.idle_forward(model, self.device)
        return out, aux

    def idle_forward(self, model: torch.nn.Module) -> torch.Tensor:
        return fsdp.idle_forward(model, self.device)

    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        fsdp.set_grad_sync(model, enabled or not self.config.fsdp.accumulate_unsharded_grads)
        return contextlib.nullcontext()

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        return fsdp.clip_grad_norm(list(model.parameters()), max_norm)

    def full_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        return fsdp.iter_full_tensors(model)

    def full_state_on_main(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        return fsdp.full_state_dict_on_rank0(model)

    def plain_copy(self, model: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
        """A plain causal LM of the model's configuration in ``dtype`` (None: the engine's
        ``dtype``), filled from the gathered tensors one at a time."""
        from transformers import AutoModelForCausalLM

        dtype = dtype or TORCH_DTYPES[self.config.dtype]
        config = self.unwrap(model).config
        plain = AutoModelForCausalLM.from_config(config, dtype=dtype).to(self.device)
        own = plain.state_dict()
        with torch.no_grad():
            for name, value in self.full_tensors(model):
                if name in own:
                    own[name].copy_(value)
        return plain

    def save_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        shard_dir: str | None,
        state: dict[str, Any],
    ) -> None:
        """Every rank writes its model and optimizer shards into ``shard_dir`` (nothing is
        gathered); ``state`` only says ``"sharded": True``."""
        if shard_dir is None:
            raise ValueError("a sharded engine writes its training state to a shard_dir")
        fsdp.save_sharded(model, optimizer, shard_dir)
        state["sharded"] = True

    def load_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        shard_dir: str | None,
        state: dict[str, Any],
    ) -> None:
        del state
        if shard_dir is None:
            raise ValueError("a sharded engine loads its training state from a shard_dir")
        fsdp.load_sharded(model, optimizer, shard_dir)
