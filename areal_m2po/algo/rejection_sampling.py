"""Rejection sampling on the behaviour drift: masked or truncated importance sampling of the
behaviour weight ``w = pi_prox / pi_behave`` per token or per sequence.

Owns :class:`RejectionSampling` (the options as plain strings and floats, checked by the same
rule as the config section, :func:`areal_m2po.algo.options.rejection_sampling_problem`) and
:func:`apply_rejection_sampling`. The actor unpacks ``actor.rejection_sampling`` into a
:class:`RejectionSampling`; a direct caller may also give a mapping of its field names
(:func:`as_rejection_sampling`). Per-token tensors are ``[B, T]``; the module imports only torch,
the standard library and the other modules of :mod:`areal_m2po.algo`, keeps no state and has no
import-time side effects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from areal_m2po.algo.kl import binary_kl, kl_estimate
from areal_m2po.algo.options import rejection_sampling_problem

__all__ = [
    "RejectionSampling",
    "apply_rejection_sampling",
    "as_rejection_sampling",
    "behaviour_weight",
]


@dataclass(frozen=True)
class RejectionSampling:
    """The rejection-sampling options, checked once (a one-line ``ValueError`` naming the
    field). The defaults are the loss's: token level, mask, ratio, mean, no bound (at least
    one of ``upper``/``lower`` must be given).

    Attributes:
        level: "token" or "sequence": act per token or per whole sequence.
        action: "mask" (drop out-of-range tokens/sequences) or "clamp" (clamp the weight).
        metric: the bounded quantity: "ratio" (``w``), "kl_k1"/"kl_k2"/"kl_k3" of it, or
            "binary_kl": the larger of the two Bernoulli KLs between the sampled token's
            proximal and behaviour probabilities (AReaL's KPop, :func:`~areal_m2po.algo.kl.binary_kl`).
        agg: how a sequence-level metric aggregates its tokens: "mean", "sum" or "max".
        upper, lower: the bounds (None: none).
    """

    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    agg: str = "mean"
    upper: float | None = None
    lower: float | None = None

    def __post_init__(self) -> None:
        problem = rejection_sampling_problem(
            self.level, self.action, self.metric, self.agg, self.upper, self.lower
        )
        if problem is not None:
            raise ValueError(": ".join(problem))


def as_rejection_sampling(
    spec: RejectionSampling | Mapping[str, Any] | None,
) -> RejectionSampling | None:
    """``spec`` as a checked :class:`RejectionSampling` (None stays None); a mapping gives
    the fields it holds, the others take the loss's defaults.

    Raises:
        TypeError: ``spec`` is neither, or a mapping with a key that is no field.
        ValueError: an invalid value, one line naming the field.
    """
    if spec is None or isinstance(spec, RejectionSampling):
        return spec
    if not isinstance(spec, Mapping):
        raise TypeError(
            "rejection_sampling must be None, a RejectionSampling or a mapping of its fields, "
            f"got {type(spec).__name__}"
        )
    names = {f.name for f in fields(RejectionSampling)}
    unknown = sorted(set(spec) - names)
    if unknown:
        raise TypeError(
            f"rejection_sampling: unknown field {unknown[0]!r} (fields: {sorted(names)})"
        )
    return RejectionSampling(**spec)


def _in_bounds(metric: torch.Tensor, lower: float | None, upper: float | None) -> torch.Tensor:
    ok = torch.ones_like(metric, dtype=torch.bool)
    if lower is not None:
        ok &= metric >= lower
    if upper is not None:
        ok &= metric <= upper
    return ok


def _sequence_metric(
    cfg: RejectionSampling, vals: torch.Tensor, cand: torch.Tensor, n_row: torch.Tensor
) -> torch.Tensor:
    """The per-row ``[B, 1]`` aggregate of ``vals`` over the row's candidate tokens."""
    if cfg.agg == "sum":
        seq = vals.sum(dim=1, keepdim=True)
    elif cfg.agg == "mean":
        seq = vals.sum(dim=1, keepdim=True) / n_row.clamp(min=1)
    else:
        seq = torch.where(cand, vals, -math.inf).amax(dim=1, keepdim=True)
        seq = torch.where(n_row == 0, torch.zeros_like(seq), seq)
    return torch.exp(seq) if cfg.metric == "ratio" else seq


def apply_rejection_sampling(
    cfg: RejectionSampling,
    log_w: torch.Tensor,
    cand: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Apply ``cfg`` to the behaviour weights of the candidate tokens.

    Args:
        cfg: the options (:class:`RejectionSampling`).
        log_w: float ``[B, T]`` log behaviour weight ``prox_logp - behave_logp``, 0 outside ``cand``.
        cand: bool ``[B, T]`` tokens still in the loss (valid and kept by M2PO).
        prox_logp, behave_logp: float ``[B, T]`` proximal / behaviour log-probs (for the KL
            metrics).
    Returns:
        ``(keep, w, affected)``: bool ``[B, T]`` keep mask, the float ``[B, T]`` behaviour
        weight to use, and the bool ``[B, T]`` candidate tokens rejected ("mask") or whose
        weight was clamped ("clamp"). At sequence level with metric "ratio", ratios are
        aggregated in log space and the row's geometric-mean ratio becomes every token's
        weight (AReaL's semantics).
    """
    w = torch.exp(log_w)
    lower, upper = cfg.lower, cfg.upper
    if cfg.metric == "ratio":
        metric = w
    elif cfg.metric == "binary_kl":
        both = torch.maximum(binary_kl(prox_logp, behave_logp), binary_kl(behave_logp, prox_logp))
        metric = torch.where(cand, both, 0.0)
    else:
        metric = torch.where(cand, kl_estimate(prox_logp, behave_logp, cfg.metric[3:]), 0.0)
    if cfg.level == "token":
        if cfg.action == "mask":
            keep = _in_bounds(metric, lower, upper)
            return keep, w, cand & ~keep
        w_new = w.clamp(min=lower, max=upper)
        return torch.ones_like(cand), w_new, cand & (w_new != w)
    if log_w.ndim != 2:
        raise ValueError("rejection_sampling.level='sequence' needs [B, T] tensors")
    n_row = cand.sum(dim=1, keepdim=True)
    if cfg.metric == "ratio":
        vals = log_w
        w = torch.exp(vals.sum(dim=1, keepdim=True) / n_row.clamp(min=1)).expand_as(log_w)
    else:
        vals = metric
    ok = _in_bounds(_sequence_metric(cfg, vals, cand, n_row), lower, upper) | (n_row == 0)
    if cfg.action == "mask":
        keep = ok.expand_as(cand)
        return keep, w, cand & ~keep
    w_new = torch.where(ok, w, w.clamp(min=lower, max=upper))
    return torch.ones_like(cand), w_new, cand & (w_new != w)


def behaviour_weight(
    rs: RejectionSampling | None,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    valid: torch.Tensor,
    cand: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w, keep, affected)``, all ``[B, T]``: the behaviour weight ``exp(prox - behave)``
    (bounded by ``rs`` on the candidate tokens), the numerator tokens (``cand`` less those
    ``rs`` rejects) and the candidate tokens rejected or clamped.

    Args:
        rs: the rejection-sampling options, or None (no bound, nothing rejected).
        prox_logp, behave_logp: float ``[B, T]`` proximal / behaviour log-probs (detached).
        valid: bool ``[B, T]``, the loss mask; ``cand``: its tokens M2PO kept. Tokens of
            ``valid`` outside ``cand`` keep their raw weight (for the statistics).
    """
    log_w = torch.where(valid, prox_logp - behave_logp, 0.0)
    if rs is None:
        return torch.exp(log_w), cand, torch.zeros_like(valid)
    keep_rs, w, affected = apply_rejection_sampling(
        rs, torch.where(cand, log_w, 0.0), cand, prox_logp, behave_logp
    )
    return torch.where(cand, w, torch.exp(log_w)), cand & keep_rs, affected
