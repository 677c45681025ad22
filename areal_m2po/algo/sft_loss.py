"""The supervised fine-tuning loss: the token-mean negative log-likelihood of the loss tokens."""

from __future__ import annotations

import torch

__all__ = ["sft_nll_loss"]


def sft_nll_loss(
    logprobs: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``-sum(logprobs * loss_mask) / sum(loss_mask)`` over one micro-batch, in nats per token.

    Args:
        logprobs: float ``[b, T]`` log-probability of each token given its prefix (nats).
        loss_mask: bool ``[b, T]``, True on the tokens that are learned (completion/assistant).

    Returns:
        ``(loss, stats)``: the 0-dim loss (0 without any loss token, still attached to the
        graph of ``logprobs``) and ``{"nll": loss}`` detached. Weighted by the number of loss
        tokens across micro-batches and ranks (the engine's ``loss_weight_fn``), the mean of
        these losses is the token mean over the whole global batch.
    """
    mask = loss_mask.to(logprobs.dtype)
    n_tokens = mask.sum()
    loss = -(logprobs * mask).sum() / n_tokens.clamp(min=1.0)
    return loss, {"nll": loss.detach()}
