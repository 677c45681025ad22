"""The clipped PPO value (critic) loss.

Owns :func:`ppo_critic_loss`. Per-token tensors are ``[B, T]`` with a ``torch.bool``
``loss_mask``; values and returns in reward units. Same ``(loss, stats)`` and denominator
conventions as :mod:`areal_m2po.algo.ppo_loss`. The module imports only torch and the other
modules of :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.aggregation import agg_loss, check_loss_inputs
from areal_m2po.algo.checks import check_choice, check_real
from areal_m2po.algo.options import VALUE_LOSS_TYPES
from areal_m2po.algo.reductions import compute_dtype, masked_sum, stat_scalar

__all__ = ["HUBER_DELTA", "critic_token_terms", "ppo_critic_loss", "value_error"]


HUBER_DELTA = 10.0
"""The Huber loss's ``delta`` (AReaL's): quadratic within it, linear beyond."""


def value_error(values: torch.Tensor, returns: torch.Tensor, loss_fn_type: str) -> torch.Tensor:
    """Elementwise error of a value prediction: ``"mse"`` ``0.5 (v - R)^2``, ``"huber"``
    ``0.5 d^2`` for ``|d| < HUBER_DELTA`` else ``HUBER_DELTA (|d| - HUBER_DELTA / 2)``."""
    check_choice("loss_fn_type", loss_fn_type, VALUE_LOSS_TYPES)
    if loss_fn_type == "mse":
        return 0.5 * (values - returns) ** 2
    d = (values - returns).abs()
    return torch.where(d < HUBER_DELTA, 0.5 * d**2, HUBER_DELTA * (d - 0.5 * HUBER_DELTA))


def critic_token_terms(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_eps_clip: float | None,
    loss_fn_type: str = "mse",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_loss, clip_active)``, elementwise on any shape: the clipped value loss
    ``max(err(v, R), err(clip(v, old - eps, old + eps), R))`` (``err`` of
    :func:`value_error`; ``err(v, R)`` alone when ``value_eps_clip`` is None) and the bool
    elements where the clipped term is the larger. ``old_values`` and ``returns`` are taken
    as constants; the result is in the inputs' dtype."""
    l1 = value_error(values, returns.detach(), loss_fn_type)
    if value_eps_clip is None:
        return l1, torch.zeros(values.shape, dtype=torch.bool, device=values.device)
    eps = check_real("value_eps_clip", value_eps_clip)
    if not eps >= 0:
        raise ValueError(f"value_eps_clip must be >= 0, got {eps}")
    old = old_values.detach()
    v_clip = old + (values - old).clamp(-eps, eps)
    l2 = value_error(v_clip, returns.detach(), loss_fn_type)
    return torch.maximum(l1, l2), l2.detach() > l1.detach()


def ppo_critic_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_fn_type: str = "mse",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``max(err(v, R), err(clip(v, old - eps, old + eps), R))``, ``err``
    the squared error ``0.5 (v - R)^2`` (``loss_fn_type="mse"``) or the Huber loss
    (``"huber"``, :func:`value_error`).

    Args:
        values: float ``[B, T]`` (differentiable); old_values, returns: ``[B, T]`` (detached).
        value_eps_clip: >= 0, or None for the unclipped ``err(v, R)``.
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
    token_loss, clip_active = critic_token_terms(
        v, old_values.to(dtype), returns.to(dtype), value_eps_clip, loss_fn_type
    )
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
