"""The KL reference policy of a LoRA actor: the actor's own base model, adapter disabled."""

from __future__ import annotations

from typing import Any

import torch

from areal_m2po.utils.data import Batch

__all__ = ["LoRABaseReference"]


class LoRABaseReference:
    """Reference log-probs from a LoRA engine's base weights (``forward_tokens`` as a frozen
    reference engine has it): the weights the adapter started from, no second copy kept.

    Args:
        engine: the actor's :class:`~areal_m2po.engine.train_engine.HFTrainEngine` (LoRA on).
    """

    def __init__(self, engine: Any) -> None:
        if not engine.lora:
            raise ValueError("LoRABaseReference needs an engine with a LoRA adapter")
        self.engine = engine

    def forward_tokens(
        self, batch: Batch, temperature: float, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs (and entropies) of the batch's tokens under the base model, float32
        ``[B, T]`` (see :meth:`HFTrainEngine.forward_tokens_base`)."""
        return self.engine.forward_tokens_base(batch, temperature, compute_entropy)
