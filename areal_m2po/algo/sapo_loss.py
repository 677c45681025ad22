"""The SAPO (Soft Adaptive Policy Optimization) policy loss: a soft sigmoid gate on the policy
ratio instead of PPO's hard clip, M2PO-masked.

Owns :func:`sapo_loss`. Per-token tensors are ``[B, T]`` with a ``torch.bool`` ``loss_mask``;
log-probs in nats (``logp`` current, ``prox_logp`` proximal, the ratio's reference). Same
``(loss, stats)`` and denominator conventions as :mod:`areal_m2po.algo.ppo_loss`. The module
imports only torch and the other modules of :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from areal_m2po.algo.aggregation import agg_loss, check_loss_inputs
from areal_m2po.algo.checks import check_choice, check_real
from areal_m2po.algo.options import IMPORTANCE_SAMPLING_LEVELS
from areal_m2po.algo.policy_ratio import policy_ratio
from areal_m2po.algo.reductions import compute_dtype, masked_sum, stat_scalar

__all__ = ["SapoTerms", "sapo_gate", "sapo_loss", "sapo_token_terms"]


def sapo_gate(ratio: torch.Tensor, tau: torch.Tensor | float) -> torch.Tensor:
    """SAPO's scaled soft gate ``(4 / tau) * sigmoid(tau * (ratio - 1))``, elementwise (``tau``
    a number or a tensor broadcastable to ``ratio``). Its derivative in ``ratio`` is
    ``4 s (1 - s)`` with ``s`` the sigmoid: 1 at ``ratio = 1``."""
    return (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0))


@dataclass(frozen=True)
class SapoTerms:
    """The per-token pieces of :func:`sapo_loss`, all ``[B, T]``: ``token_loss`` (float,
    carries the gradient; read on ``keep`` only), ``valid`` (bool, the loss mask), ``keep``
    (bool, valid and kept by M2PO), ``ratio`` and ``advantages`` (detached; GSPO: the row's
    sequence ratio and mean advantage; 1 and 0 outside ``valid``), ``gate`` (detached, the
    gradient weight ``4 s (1 - s)``) and ``approx_kl`` (detached, ``prox_logp - logp``)."""

    token_loss: torch.Tensor
    valid: torch.Tensor
    keep: torch.Tensor
    ratio: torch.Tensor
    advantages: torch.Tensor
    gate: torch.Tensor
    approx_kl: torch.Tensor


def sapo_token_terms(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    advantages: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    *,
    importance_sampling_level: str = "token",
) -> SapoTerms:
    """The per-token terms of :func:`sapo_loss` (same arguments), before aggregation."""
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
    s = torch.sigmoid(tau * (ratio.detach() - 1.0))
    return SapoTerms(
        # the product in this order: the trainer's loss, bit for bit as before the terms split
        token_loss=-adv * (4.0 / tau) * torch.sigmoid(tau * (ratio - 1.0)),
        valid=valid,
        keep=keep,
        ratio=ratio.detach(),
        advantages=adv,
        gate=4.0 * s * (1.0 - s),
        approx_kl=ref - lp.detach(),
    )


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
    terms = sapo_token_terms(
        logp,
        prox_logp,
        advantages,
        tau_pos,
        tau_neg,
        loss_mask,
        m2po_mask,
        loss_agg_mode,
        importance_sampling_level=importance_sampling_level,
    )
    valid = terms.valid
    loss = agg_loss(terms.token_loss, terms.keep, valid, loss_agg_mode, max_tokens_norm)
    with torch.no_grad():
        dev = logp.device
        n_valid = valid.sum().clamp(min=1)
        gate = terms.gate
        # the valid tokens' minimum (0 without one), with no host sync: the others filled
        gate_min = gate.masked_fill(~valid, float("inf")).min()
        gate_min = torch.where(valid.any(), gate_min, torch.zeros_like(gate_min))
        stats = {
            "sapo/gate_mean": stat_scalar(masked_sum(gate, valid) / n_valid, dev),
            "sapo/gate_min": stat_scalar(gate_min, dev),
            "sapo/soft_gate_fraction": stat_scalar((valid & (gate < 0.5)).sum() / n_valid, dev),
            "actor/importance_weight": stat_scalar(masked_sum(terms.ratio, valid) / n_valid, dev),
            "actor/approx_kl": stat_scalar(masked_sum(terms.approx_kl, valid) / n_valid, dev),
            "actor/pg_loss": stat_scalar(loss, dev),
        }
    return loss, stats
