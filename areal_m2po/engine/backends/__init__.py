"""Placement backends of the train engine, one module each: :mod:`.ddp` (one process or
Accelerate's DDP: the model replicated) and :mod:`.fsdp2` (FSDP2: the model sharded), both on
the interface of :mod:`.base`. :func:`placement_backend` is where ``backend`` is read.
LoRA is no backend: an adapter on either (:class:`~areal_m2po.engine.lora.LoRAAdapter`)."""

from __future__ import annotations

from accelerate import Accelerator

from areal_m2po.api.cli_args import TrainEngineConfig
from areal_m2po.engine.backends.base import PlacementBackend
from areal_m2po.engine.backends.ddp import DDPBackend
from areal_m2po.engine.backends.fsdp2 import FSDP2Backend
from areal_m2po.engine.precision import MixedPrecision

__all__ = ["DDPBackend", "FSDP2Backend", "PlacementBackend", "backend_class", "placement_backend"]

_BACKENDS: dict[str, type[PlacementBackend]] = {"ddp": DDPBackend, "fsdp2": FSDP2Backend}


def backend_class(name: str) -> type[PlacementBackend]:
    """The backend class of a ``backend`` key (``ddp`` or ``fsdp2``).

    Raises:
        ValueError: for any other name.
    """
    try:
        return _BACKENDS[name]
    except KeyError:
        raise ValueError(f"backend {name!r}: one of {sorted(_BACKENDS)}") from None


def placement_backend(
    config: TrainEngineConfig, accelerator: Accelerator, precision: MixedPrecision
) -> PlacementBackend:
    """The backend ``config.backend`` names, for the engine of ``config``."""
    return backend_class(config.backend)(config, accelerator, precision)
