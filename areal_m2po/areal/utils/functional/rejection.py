"""AReaL's ``apply_rejection_sampling`` (areal-project/AReaL cbff54d6,
``areal/utils/functional/functional.py``): an adapter over this package's one rejection
sampler, :func:`areal_m2po.algo.rejection_sampling.apply_rejection_sampling`.

What the adapter adds to the package's function, which takes the ``[B, T]`` rows of the loss:

* AReaL's signature ``(proximal_logprobs, old_logprobs, loss_mask, cu_seqlens, config)`` and
  its layouts: padded ``[B, T]`` or 1-D packed ``[N]`` (per sequence by ``cu_seqlens``,
  required at sequence level);
* AReaL's ``config`` (its ``RejectionSamplingConfig`` or anything with the fields ``level``,
  ``action``, ``metric``, ``agg``, ``upper``, ``lower``), read into the package's
  :class:`~areal_m2po.algo.rejection_sampling.RejectionSampling`;
* AReaL's result, :class:`RejectionSamplingResult`: the new mask (``loss_mask``'s dtype), the
  behaviour weight 0 outside it, and the fraction of the mask's tokens rejected or clamped;
* a non-finite ``proximal - old`` log-ratio counts as 0 (weight 1), as in AReaL; the metrics
  are computed in float32.

Keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from areal_m2po.algo import rejection_sampling as rs_maths
from areal_m2po.algo.kl import binary_kl
from areal_m2po.algo.rejection_sampling import RejectionSampling
from areal_m2po.areal.utils.functional._layout import layout

__all__ = [
    "RejectionSamplingResult",
    "apply_rejection_sampling",
    "as_options",
    "compute_binary_kl_divergence",
    "rs_layout_message",
]

_NEED_CU_SEQLENS_RS = "cu_seqlens is required for 1D packed tensors in sequence-level filtering."


def as_options(rs: Any) -> RejectionSampling | None:
    """AReaL's ``rejection_sampling`` argument (its config section, or any object or mapping
    with :class:`RejectionSampling`'s field names; fields it lacks take the loss's defaults)
    as a checked :class:`RejectionSampling` (None stays None)."""
    if rs is None or isinstance(rs, RejectionSampling):
        return rs
    if not isinstance(rs, Mapping):
        rs = {f.name: getattr(rs, f.name) for f in fields(RejectionSampling) if hasattr(rs, f.name)}
    return RejectionSampling(**rs)


def rs_layout_message(rs: RejectionSampling | None) -> str | None:
    """AReaL's refusal of a 1-D input without ``cu_seqlens`` at sequence level (else None)."""
    return _NEED_CU_SEQLENS_RS if rs is not None and rs.level == "sequence" else None


@dataclass
class RejectionSamplingResult:
    """What :func:`apply_rejection_sampling` gives.

    Attributes:
        loss_mask: the mask after rejection ("mask"), or the input mask ("clamp").
        behave_imp_weight: ``pi_prox / pi_behave`` per token (clamped where "clamp" acted;
            the sequence's geometric mean at sequence level with metric "ratio"), 0 outside the
            returned mask.
        filtered_fraction: share of the input mask's tokens rejected or clamped.
    """

    loss_mask: torch.Tensor
    behave_imp_weight: torch.Tensor
    filtered_fraction: float


def compute_binary_kl_divergence(
    log_p: torch.Tensor, log_q: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """KL between Bernoulli(p) and Bernoulli(q), ``p = exp(log_p)``, ``q = exp(log_q)``, both
    clamped to ``[eps, 1 - eps]`` (:func:`areal_m2po.algo.kl.binary_kl`)."""
    return binary_kl(log_p, log_q, eps)


def apply_rejection_sampling(
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    config: Any,
) -> RejectionSamplingResult:
    """AReaL's rejection sampling of the proximal-vs-behaviour drift (see the module doc).

    Args:
        proximal_logprobs, old_logprobs, loss_mask: ``[B, T]`` padded or ``[N]`` packed.
        cu_seqlens: int ``[B + 1]`` sequence boundaries of packed inputs (sequence level).
        config: AReaL's ``RejectionSamplingConfig`` or anything with its fields.

    Raises:
        ValueError: mismatched shapes, not 1-D or 2-D, a packed sequence-level call without
            ``cu_seqlens``, invalid options (one line naming the field).
    """
    shape = proximal_logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ValueError(f"proximal_logprobs shape {shape} != {name} shape {t.shape}")
    rs = as_options(config)
    assert rs is not None  # AReaL's function always takes a config
    lay = layout(proximal_logprobs, cu_seqlens, rs_layout_message(rs))
    prox = lay.to_rows(proximal_logprobs.detach().float())
    old = lay.to_rows(old_logprobs.detach().float())
    valid = lay.to_rows(loss_mask).bool()
    log_w = prox - old
    log_w = torch.where(torch.isfinite(log_w) & valid, log_w, 0.0)
    keep, weight, affected = rs_maths.apply_rejection_sampling(rs, log_w, valid, prox, old)
    if rs.action == "mask":
        new_mask = lay.to_caller(valid & keep).to(loss_mask.dtype)
    else:
        new_mask = loss_mask
    fraction = affected.sum().item() / max(valid.sum().item(), 1)
    weight = torch.where(new_mask.bool(), lay.to_caller(weight), 0.0)
    return RejectionSamplingResult(new_mask, weight, fraction)
