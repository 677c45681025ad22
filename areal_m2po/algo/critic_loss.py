"""The clipped PPO value (critic) loss.

Owns :func:`ppo_critic_loss`. Per-token tensors are ``[B, T]`` with a ``torch.bool``
``loss_mask``; values and returns in reward units. Same ``(loss, stats)`` and denominator
conventions as :mod:`areal_m2po.algo.ppo_loss`. The module imports only torch and the other
modules of :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.aggregation import agg_loss, check_loss_inputs
from areal_m2po.algo.checks import check_real
from areal_m2po.algo.reductions import compute_dtype, masked_sum, stat_scalar

__all__ = ["ppo_critic_loss"]


def ppo_critic_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, old - eps, old + eps) - R)^2)``.

    Args:
        values: float ``[B, T]`` (differentiable); old_values, returns: ``[B, T]`` (detached).
        value_eps_clip: >= 0, or None for the unclipped ``0.5 (v - R)^2``.
        loss_mask: bool ``[B, T]``.
    Returns:
        ``(loss, stats)`` with ``critic/value_clip_fraction`` (valid tokens where the clipped
        term is the larger), ``critic/value_loss``, ``critic/values_mean``.
    """
    check_loss_inputs(
        loss_mask, None, loss_agg_mode, values=values, old_values=old_values, returns=returns
    )
    dtype = compute_dtype(values, old_values, returns)
    v = values.to(dtype)
    old = old_values.detach().to(dtype)
    ret = returns.detach().to(dtype)
    l1 = (v - ret) ** 2
    if value_eps_clip is None:
        token_loss = 0.5 * l1
        clip_active = torch.zeros_like(loss_mask)
    else:
        eps = check_real("value_eps_clip", value_eps_clip)
        if not eps >= 0:
            raise ValueError(f"value_eps_clip must be >= 0, got {eps}")
        v_clip = old + (v - old).clamp(-eps, eps)
        l2 = (v_clip - ret) ** 2
        token_loss = 0.5 * torch.maximum(l1, l2)
        clip_active = l2.detach() > l1.detach()
    loss = agg_loss(token_loss, loss_mask, loss_mask, loss_agg_mode)
    with torch.no_grad():
        dev = values.device
        n_valid = loss_mask.sum().clamp(min=1)
        stats = {
            "critic/value_clip_fraction": stat_scalar(
                (clip_active & loss_mask).sum() / n_valid, dev
            ),
            "critic/value_loss": stat_scalar(loss, dev),
            "critic/values_mean": stat_scalar(masked_sum(v.detach(), loss_mask) / n_valid, dev),
        }
    return loss, stats
