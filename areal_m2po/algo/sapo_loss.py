"""The SAPO (Soft Adaptive Policy Optimization) policy loss: a soft sigmoid gate on the policy
ratio instead of PPO's hard clip, M2PO-masked.

Owns :func:`sapo_loss`. Per-token tensors are ``[B, T]`` with a ``torch.bool`` ``loss_mask``;
log-probs in nats (``logp`` current, ``prox_logp`` proximal, the ratio's reference). Same
``(loss, stats)`` and denominator conventions as :mod:`areal_m2po.algo.ppo_loss`. The module
imports only torch and the other modules of :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.aggregation import agg_loss, check_loss_inputs
from areal_m2po.algo.checks import check_choice, check_real
from areal_m2po.algo.options import IMPORTANCE_SAMPLING_LEVELS
from areal_m2po.algo.policy_ratio import policy_ratio
from areal_m2po.algo.reductions import compute_dtype, masked_sum, stat_scalar

__all__ = ["sapo_loss"]


def sapo_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    advantages: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    max_tokens_norm: int | None = None,
    *,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization) loss: a soft sigmoid gate instead of a hard clip.

    With ``r = exp(logp - prox_logp)`` (the proximal policy is the ratio's reference) and ``tau = tau_pos if A > 0 else tau_neg``, the token loss is
    ``-A * (4 / tau) * sigmoid(tau * (r - 1))`` (AReaL's gate). Its gradient is
    ``-A * g * r * grad(logp)`` with gate weight ``g = 4 s (1 - s)``,
    ``s = sigmoid(tau (r - 1))``: ``g = 1`` at ``r = 1`` (vanilla policy gradient), decaying
    smoothly off-policy. Same numerator/denominator/aggregation rules as
    :func:`~areal_m2po.algo.ppo_loss.ppo_actor_loss`; ``importance_sampling_level="sequence"`` uses the GSPO ratio.

    Args:
        logp: float ``[B, T]`` (differentiable); prox_logp, advantages: ``[B, T]``.
        tau_pos, tau_neg: gate temperatures (> 0).
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` or None.
    Returns:
        ``(loss, stats)`` with ``sapo/gate_mean``, ``sapo/gate_min``,
        ``sapo/soft_gate_fraction`` (valid tokens with ``g < 0.5``),
        ``actor/importance_weight``, ``actor/approx_kl`` (proximal - current), ``actor/pg_loss``.
    """
    check_loss_inputs(
        loss_mask,
        m2po_mask,
        loss_agg_mode,
        logp=logp,
        prox_logp=prox_logp,
        advantages=advantages,
    )
    tp = check_real("tau_pos", tau_pos)
    tn = check_real("tau_neg", tau_neg)
    if not tp > 0:
        raise ValueError(f"tau_pos must be > 0, got {tp}")
    if not tn > 0:
        raise ValueError(f"tau_neg must be > 0, got {tn}")
    check_choice("importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
    dtype = compute_dtype(logp, prox_logp, advantages)
    valid = loss_mask
    keep = valid if m2po_mask is None else valid & m2po_mask
    lp = logp.to(dtype)
    ref = prox_logp.detach().to(dtype)
    adv = torch.where(valid, advantages.detach().to(dtype), 0.0)
    ratio, adv = policy_ratio(lp, ref, adv, valid, keep, importance_sampling_level)
    tau = torch.where(adv > 0, tp, tn).to(dtype)
    s = torch.sigmoid(tau * (ratio - 1.0))
    token_loss = -adv * (4.0 / tau) * s
    loss = agg_loss(token_loss, keep, valid, loss_agg_mode, max_tokens_norm)
    with torch.no_grad():
        dev = logp.device
        n_valid = valid.sum().clamp(min=1)
        sd = s.detach()
        gate = 4.0 * sd * (1.0 - sd)
        r = ratio.detach()
        stats = {
            "sapo/gate_mean": stat_scalar(masked_sum(gate, valid) / n_valid, dev),
            "sapo/gate_min": stat_scalar(gate[valid].min() if bool(valid.any()) else 0.0, dev),
            "sapo/soft_gate_fraction": stat_scalar((valid & (gate < 0.5)).sum() / n_valid, dev),
            "actor/importance_weight": stat_scalar(masked_sum(r, valid) / n_valid, dev),
            "actor/approx_kl": stat_scalar(masked_sum(ref - lp.detach(), valid) / n_valid, dev),
            "actor/pg_loss": stat_scalar(loss, dev),
        }
    return loss, stats
