"""Mixed precision of a trainable model whose dtype is float16, and the finiteness check of
weights about to be saved.

A trainable engine with ``dtype: float16`` trains as mixed precision is usually meant (what
``accelerate``'s and the Hugging Face Trainer's ``fp16`` mode do): the trainable parameters,
their gradients and the optimizer state are float32 (the master weights; AdamW's ``eps=1e-8``
and an update of ``lr * 1`` on a weight of 0.02 both vanish in float16), the forward and
backward compute in float16 (``torch.autocast``; a sharded model gathers its parameters in
float16 through FSDP2's ``MixedPrecisionPolicy`` instead), and the loss is multiplied by a
dynamic loss scale so that small gradients do not underflow in float16 (:class:`LossScale`).
A frozen model (the reference policy) and the frozen base of a LoRA model stay in float16.

bfloat16 and float32 models train in their own dtype, as before.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from areal_m2po.utils import dist

__all__ = [
    "TORCH_DTYPES",
    "LossScale",
    "MixedPrecision",
    "check_finite_weights",
    "load_dtype",
    "non_finite_tensors",
]

FLOAT16 = "float16"

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The ``dtype`` keys of the engine sections as torch dtypes."""


def load_dtype(dtype: str, trainable: bool, lora: bool) -> str:
    """The dtype to load a model's weights in: float32 (the master weights) for a fully trained
    float16 model; ``dtype`` otherwise (a LoRA model's frozen base stays float16, its trainable
    parameters are made float32 by :meth:`MixedPrecision.upcast_trainable`)."""
    return "float32" if dtype == FLOAT16 and trainable and not lora else dtype


class LossScale:
    """A dynamic loss scale: the loss is multiplied by :attr:`scale` before the backward, the
    gradients divided by it after; an overflow (a finite loss whose gradient is not finite)
    halves it, ``growth_interval`` steps in a row without one double it (the schedule of
    ``torch.amp.GradScaler``, driven by the engine's step verdict, which is the same on every
    rank; ``GradScaler`` decides from each rank's own gradient shards).

    Args:
        init_scale: the first scale (``GradScaler``'s default, 2**16).
        growth_interval: good steps before the scale doubles.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_interval = growth_interval
        self.good_steps = 0

    def unscale_(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Divide every gradient by the scale, in place."""
        inv = 1.0 / self.scale
        with torch.no_grad():
            for p in parameters:
                if p.grad is not None:
                    p.grad.mul_(inv)

    def update(self, overflow: bool) -> None:
        """Halve the scale after an overflow; double it after ``growth_interval`` good steps."""
        if overflow:
            self.scale /= 2.0
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps >= self.growth_interval:
            self.scale *= 2.0
            self.good_steps = 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "good_steps": float(self.good_steps)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state["good_steps"])


class MixedPrecision:
    """What a trainable engine does differently when its model dtype is float16 (``enabled``);
    a no-op for any other dtype or a frozen model.

    Args:
        dtype: the engine's ``dtype`` key (``float32``, ``bfloat16``, ``float16``).
        trainable: whether the engine trains (has an optimizer).
        sharded: whether FSDP2 shards the model (it casts the parameters itself).
        device_type: ``cpu`` or ``cuda``, for ``torch.autocast``.
    """

    def __init__(self, dtype: str, trainable: bool, sharded: bool, device_type: str) -> None:
        self.enabled = dtype == FLOAT16 and trainable
        self.sharded = sharded
        self.device_type = device_type
        self.loss_scale = LossScale() if self.enabled else None

    def upcast_trainable(self, model: torch.nn.Module) -> None:
        """Make every trainable parameter float32 (LoRA adapters, a fresh head), in place."""
        if not self.enabled:
            return
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.float()

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """float16 autocast for a forward of the unsharded model (nothing otherwise)."""
        if not self.enabled or self.sharded:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=torch.float16)

    @property
    def scale(self) -> float:
        """The factor the loss is multiplied by before the backward (1 when off)."""
        return self.loss_scale.scale if self.loss_scale is not None else 1.0

    def unscale_(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        if self.loss_scale is not None:
            self.loss_scale.unscale_(parameters)

    def overflowed(self, loss_finite: bool, grad_finite: bool) -> bool:
        """Update the loss scale after a step; True when the step's gradient overflowed
        because of the scale (a finite loss, a non-finite gradient, a scale above 1): the step
        is skipped and the scale halved. A non-finite loss, or a non-finite gradient at a scale
        of 1 or less, is no overflow but a non-finite step."""
        if self.loss_scale is None:
            return False
        overflow = loss_finite and not grad_finite and self.loss_scale.scale > 1.0
        if loss_finite and (grad_finite or overflow):
            self.loss_scale.update(overflow)
        return overflow

    def state_dict(self) -> dict[str, float] | None:
        return self.loss_scale.state_dict() if self.loss_scale is not None else None

    def load_state_dict(self, state: dict[str, float] | None) -> None:
        if self.loss_scale is not None and state is not None:
            self.loss_scale.load_state_dict(state)


def non_finite_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[str]:
    """The names of the floating-point tensors in ``named`` holding a NaN or an infinity (a
    sharded tensor: this rank's shard)."""
    for name, tensor in named:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        if local.is_floating_point() and not bool(torch.isfinite(local).all()):
            yield name


def check_finite_weights(model: torch.nn.Module, what: str) -> None:
    """Raise :class:`~areal_m2po.api.errors.NonFiniteWeightsError` when a parameter of
    ``model`` holds a NaN or an infinity on any rank (every rank calls it in a distributed
    run): nothing is saved from such weights. ``what`` names the save in the message."""
    from areal_m2po.api.errors import NonFiniteWeightsError

    names = list(non_finite_tensors(model.named_parameters()))
    bad = float(len(names))
    if dist.is_distributed():
        bad = float(dist.all_reduce_max(torch.tensor([bad]))[0])
    if bad > 0 or not math.isfinite(bad):
        total = sum(1 for _ in model.parameters())
        first = f" (first: {names[0]})" if names else ""
        raise NonFiniteWeightsError(
            f"not saving {what}: {int(bad)} of {total} weight tensors hold NaN or inf{first}; "
            "the last good recover checkpoint, if any, is untouched"
        )
