"""What a placement backend does for the train engine: where the model's parameters live and
what a forward, a backward, a gradient norm and a save cost across processes.

The engine (:class:`~areal_m2po.engine.train_engine.HFTrainEngine`) holds the training step,
micro-batching, mixed precision and the optimizer step; it asks its backend for everything
that differs between a replicated model (:mod:`.ddp`: one process or Accelerate's DDP) and a
sharded one (:mod:`.fsdp2`). :func:`~areal_m2po.engine.backends.placement_backend` picks the
backend from ``config.backend``, in one place.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from accelerate import Accelerator

from areal_m2po.api.cli_args import TrainEngineConfig
from areal_m2po.engine.precision import MixedPrecision

__all__ = ["PlacementBackend", "Prepared"]

Prepared = tuple[torch.nn.Module, torch.optim.Optimizer, Any]
"""``(model, optimizer, scheduler)`` of a trainable model once placed."""


class PlacementBackend(abc.ABC):
    """How one engine's model is placed over the processes of the run.

    Args:
        config: the engine's section (``backend``, ``fsdp``, ``optimizer``).
        accelerator: the run's Accelerator (it owns devices and the process group).
        precision: the engine's mixed precision (float16: what FSDP2 gathers parameters in).
    """

    name: str = ""
    sharded: bool = False
    """Every forward and backward is a collective over all processes."""

    def __init__(
        self, config: TrainEngineConfig, accelerator: Accelerator, precision: MixedPrecision
    ) -> None:
        self.config = config
        self.accelerator = accelerator
        self.precision = precision

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model without the backend's wrapper (DDP's ``.module``)."""
        return self.accelerator.unwrap_model(model)

    # -- placing ------------------------------------------------------------------------------

    @abc.abstractmethod
    def place(self, raw: torch.nn.Module) -> torch.nn.Module:
        """A frozen model on this process's device (sharded: over all processes)."""

    @abc.abstractmethod
    def prepare(self, raw: torch.nn.Module, total_steps: int) -> Prepared:
        """A trainable model placed, with its optimizer and LR scheduler
        (:func:`~areal_m2po.engine.optim.build_optimizer` over ``total_steps`` steps)."""

    # -- one training step --------------------------------------------------------------------

    def idle_micro_batches(self, n_local: int) -> int:
        """Idle forwards this rank adds so that every rank runs as many forwards (0 unless
        sharded; a collective when sharded)."""
        del n_local
        return 0

    def forward(
        self, model: torch.nn.Module, run: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``run()``, the engine's forward of one micro-batch on ``model``; a sharded backend
        makes sure the model was called (see :meth:`.fsdp2.FSDP2Backend.forward`)."""
        del model
        return run()

    def idle_forward(self, model: torch.nn.Module) -> torch.Tensor:
        """One forward of a rank with nothing to compute (sharded only): a zero tied to the
        parameters, whose backward joins the gradient reduction."""
        raise NotImplementedError(f"backend {self.name}: no idle forwards")

    @abc.abstractmethod
    def grad_sync(self, model: torch.nn.Module, enabled: bool) -> AbstractContextManager[Any]:
        """A context in which the backward reduces gradients over ranks only if ``enabled``."""

    @abc.abstractmethod
    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> torch.Tensor:
        """Clip the gradients to a global L2 norm of ``max_norm``; the norm before (0-dim)."""

    # -- weights out --------------------------------------------------------------------------

    @abc.abstractmethod
    def full_tensors(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` of every state entry, as the model names them, one at a time
        (sharded: gathered one by one, a collective every rank consumes to the end)."""

    @abc.abstractmethod
    def full_state_on_main(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The whole model state on the main process (for ``save_pretrained``; a collective)."""

    @abc.abstractmethod
    def plain_copy(self, model: torch.nn.Module, dtype: torch.dtype | None) -> torch.nn.Module:
        """An unsharded copy of ``model`` on this rank's device, in ``dtype`` (None: as it
        is): what the rollout engine starts from (a collective when sharded)."""

    # -- recover checkpoints ------------------------------------------------------------------

    @abc.abstractmethod
    def save_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        shard_dir: str | None,
        state: dict[str, Any],
    ) -> None:
        """Put the model and optimizer state into ``state`` (sharded: into ``shard_dir``)."""

    @abc.abstractmethod
    def load_state(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        shard_dir: str | None,
        state: dict[str, Any],
    ) -> None:
        """Restore what :meth:`save_state` wrote."""

    def check_state_backend(self, state: dict[str, Any]) -> None:
        """Refuse a training state written by the other backend."""
        if bool(state.get("sharded", False)) != self.sharded:
            raise ValueError(
                "written with backend "
                + ("fsdp2" if state.get("sharded") else "ddp")
                + f" but this run uses backend {self.config.backend}"
            )
