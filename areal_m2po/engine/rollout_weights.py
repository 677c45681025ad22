"""What a train engine hands the rollout side: the policy's weights at one version.

:meth:`~areal_m2po.engine.train_engine.HFTrainEngine.weights_for_rollout` builds it; the engine
decides what a plain (unsharded, unadapted, rollout-dtype) policy needs, so no trainer reads
whether the model is sharded, carries a LoRA adapter or trains in float16 mixed precision.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["RolloutWeights"]


@dataclasses.dataclass(frozen=True)
class RolloutWeights:
    """The policy's weights for the rollout side.

    Attributes:
        version: the policy's version (optimizer updates so far).
        named_tensors: a fresh ``(name, full tensor)`` stream under the plain model's names,
            each call (sharded: gathered one tensor at a time, a collective every rank consumes
            to the end; LoRA: ``W + s * B @ A`` merged layer by layer; float16 mixed precision:
            the float32 master weights, cast by the receiver).
        model: gives an unsharded plain causal LM holding the policy, on the engine's device:
            the engine's own module when :attr:`own_module`, else a fresh copy (sharded:
            gathered; LoRA: merged; float16 mixed precision: a float16 copy; a collective when
            sharded).
        own_module: :attr:`model` gives the trainer's own module, updated in place by every
            optimizer step: an in-process rollout engine may generate from it without a copy.
        model_config: the policy's ``transformers`` config.
        generation_config: its generation config (None when it has none).
    """

    version: int
    named_tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]
    model: Callable[[], torch.nn.Module]
    own_module: bool
    model_config: Any
    generation_config: Any = None
