"""AReaL's ``areal.trainer.ppo.actor`` pure functions (areal-project/AReaL cbff54d6), adapters
over this package's maths. AReaL's ``PPOActor`` is its trainer; this package's is
:class:`areal_m2po.trainer.ppo.actor.PPOActor` (not re-exported here).

* :func:`compute_prox_logp_approximations`: the proximal version is ``current_version - 1``;
  "loglinear" is :func:`areal_m2po.algo.proximal.loglinear_alpha` and
  :func:`~areal_m2po.algo.proximal.loglinear_interpolate` (the trainer's
  ``prox_logp_method=loglinear``) with AReaL's rules for ``alpha``: 0 for prompt tokens
  (``versions < 0``) and where ``current_version <= v``, clamped to [0, 1] (the trainer
  instead takes the current log-probs where it is not ahead); "linear" is
  ``log((1 - alpha) e^old + alpha e^new + 1e-10)`` (AReaL's metric only); "rollout" is ``old``.
* :func:`_get_m2po_loss_mask`, :func:`_apply_m2po_masking`: AReaL's M2PO helpers over
  :func:`areal_m2po.algo.m2po.m2po_keep_mask` and :func:`~areal_m2po.algo.m2po.m2po_mask`.
"""

from __future__ import annotations

import torch

from areal_m2po.algo import m2po
from areal_m2po.algo.proximal import loglinear_alpha, loglinear_interpolate
from areal_m2po.areal.utils.constants import (
    PROX_APPROX_METHOD_LINEAR,
    PROX_APPROX_METHOD_LOGLINEAR,
    PROX_APPROX_METHOD_ROLLOUT,
    PROX_APPROX_METHODS_ALL,
)

__all__ = ["_apply_m2po_masking", "_get_m2po_loss_mask", "compute_prox_logp_approximations"]


def compute_prox_logp_approximations(
    old_logp: torch.Tensor,
    logprobs: torch.Tensor,
    versions: torch.Tensor,
    current_version: int,
    method: str | None = None,
) -> dict[str, torch.Tensor]:
    """Approximate proximal log-probs (see the module docstring).

    Args:
        old_logp: behaviour log-probs, any shape.
        logprobs: the current policy's, same shape.
        versions: int, the behaviour version per token (negative: prompt), same shape.
        current_version: the policy's version now.
        method: one name of :data:`PROX_APPROX_METHODS_ALL` (None: all of them).

    Returns:
        ``{method: tensor}`` for the method(s) asked (an unknown name gives nothing).
    """
    prox_version = float(current_version - 1)
    alpha = loglinear_alpha(versions, prox_version, float(current_version), not_ahead=0.0)
    alpha = torch.where(versions >= 0, alpha, 0.0).clamp(0.0, 1.0)
    out: dict[str, torch.Tensor] = {}
    for name in [method] if method else PROX_APPROX_METHODS_ALL:
        if name == PROX_APPROX_METHOD_LOGLINEAR:
            out[name] = loglinear_interpolate(old_logp, logprobs, alpha)
        elif name == PROX_APPROX_METHOD_LINEAR:
            mixed = (1 - alpha) * torch.exp(old_logp) + alpha * torch.exp(logprobs)
            out[name] = torch.log(mixed + 1e-10)
        elif name == PROX_APPROX_METHOD_ROLLOUT:
            out[name] = old_logp.clone()
    return out


def _get_m2po_loss_mask(sorted_m2: torch.Tensor, m2_threshold: float) -> torch.Tensor:
    """AReaL's helper: the M2PO keep mask (bool ``[N]``, True = keep) over 1-D m2 values
    already sorted in descending order, i.e. :func:`m2po.m2po_keep_mask` of them.

    Raises:
        ValueError: ``sorted_m2`` is not sorted in descending order (and the errors of
            :func:`m2po.m2po_keep_mask`).
    """
    keep = m2po.m2po_keep_mask(sorted_m2, m2_threshold)
    if bool((sorted_m2[1:] > sorted_m2[:-1]).any()):
        raise ValueError("sorted_m2 must be sorted in descending order")
    return keep


def _apply_m2po_masking(
    old_logp: torch.Tensor,
    prox_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    m2_threshold: float,
) -> torch.Tensor:
    """AReaL's ``_apply_m2po_masking``: the M2PO keep mask (bool, ``loss_mask``'s shape, False
    outside it) of one batch over every valid token, which the caller passes to the loss as
    its ``loss_mask``: :func:`m2po.m2po_mask` without its statistics, with AReaL's name
    ``old_logp`` for its ``behave_logp``."""
    return m2po.m2po_mask(old_logp, prox_logp, loss_mask, m2_threshold, stats_dtype=None)[0]
