"""M2PO masking: the one rule, its input checks and its diagnostics.

M2PO (second-moment trust policy optimisation) masks, before the policy loss, the valid tokens
whose behaviour-vs-proximal log-ratio has an outsized second moment:

* per valid token ``i``: ``m2_i = (behave_logp_i - prox_logp_i)^2`` in nats^2, computed in
  float64 from the log-probs (float32 log-probs are upcast exactly before the difference);
* the rule (the paper's Algorithm 1, AReaL's ``_apply_m2po_masking``): drop the largest m2, one
  at a time, until the mean m2 of the tokens left is strictly below ``m2_threshold``; keep at
  least one token. Among equal m2 values the one with the smaller flat index is dropped first.

"Mean" is the exact mean of the float values (real arithmetic, no rounding), so the mask does
not depend on the summation order, the device or the dtype the values arrived in (float16,
bfloat16 and float32 values are exactly representable in float64). It is computed vectorised:
one stable descending sort, float64 cumulative sums with a rigorous rounding-error bound, and,
only when a cumulative mean lies within that bound of the threshold (a mean that rounds onto
it), an exact integer evaluation of the few candidate cut points (binary search, each step one
vectorised pass). The cut exists because the mean of the ``k`` smallest values never decreases
as ``k`` grows, so "mean < threshold" holds exactly for a prefix of the ascending order.

Token sets (``actor.m2_token_set``): ``all`` (AReaL's rule, the default) takes every valid token
as a candidate; ``trust_region`` (the final ICLR 2026 version of the paper, as Trinity-RFT PR #616
and ms-swift PR #9965 implement it) takes only the valid tokens in PPO's active trust-region
quadrants, ``A > 0 and r > 1`` or ``A < 0 and r < 1`` with ``r = pi_prox / pi_behave`` (so
``prox_logp > behave_logp`` or ``prox_logp < behave_logp``; ``A = 0`` or ``r = 1`` is outside).
The rule then runs over the candidates' m2 only (their mean is the statistic), only candidates can
be masked, and every other valid token is kept. The loss denominator (all valid tokens before
masking) is the loss's business and is the same for both sets.

Shapes: per-token tensors are ``[B, T]`` with a ``torch.bool`` ``loss_mask`` (True on valid
tokens); the rule itself works on the 1-D vector of the candidates' m2. The module imports
only torch and the standard library and keeps no state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import torch

from areal_m2po.algo.checks import (
    check_bool_mask,
    check_choice,
    check_real,
    check_same_shape,
    check_tensor,
)

__all__ = [
    "TOKEN_SETS",
    "RankGather",
    "check_m2_threshold",
    "m2_per_token",
    "m2po_candidates",
    "m2po_keep_mask",
    "m2po_mask",
    "m2po_mask_of_m2",
    "m2po_stats",
    "trust_region_tokens",
]

TOKEN_SETS = ("all", "trust_region")
"""The candidate sets of the rule: every valid token, or those in the trust-region quadrants."""

RankGather = Callable[[torch.Tensor], tuple[list[torch.Tensor], int]]
"""Gathers a 1-D tensor from every rank of a process group: ``(every rank's tensor, in rank
order; this rank's index)`` (ranks may hold different lengths)."""

_UNIT_ROUNDOFF = 2.0**-53  # float64
_ABS_SLACK = 2.0**-1060  # covers underflow of k * threshold (absolute error <= 2^-1075)
_MANTISSA_BITS = 53
_HALF_BITS = 26  # int64 mantissas are summed as two halves so no partial sum overflows


def check_m2_threshold(m2_threshold: Any) -> float:
    """``m2_threshold`` as a float; a one-line ValueError unless it is finite and > 0."""
    if m2_threshold is None:
        raise ValueError("m2_threshold must be a positive finite number, got None")
    thr = check_real("m2_threshold", m2_threshold)
    if not math.isfinite(thr) or thr <= 0.0:
        raise ValueError(f"m2_threshold must be a positive finite number, got {thr}")
    return thr


def m2_per_token(
    behave_logp: torch.Tensor, prox_logp: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """Per-token second moment ``(behave_logp - prox_logp)^2``, checked.

    Args:
        behave_logp: float ``[B, T]`` behaviour log-probs (nats), recorded at generation.
        prox_logp: float ``[B, T]`` proximal log-probs (nats), recomputed at step start.
        loss_mask: bool ``[B, T]``, True on valid tokens.
    Returns:
        float64 ``[B, T]`` (nats^2), 0.0 outside ``loss_mask`` (whatever the log-probs hold
        there, NaN included). Detached.
    Raises:
        TypeError: non-bool ``loss_mask``, non-float log-probs.
        ValueError: shape mismatch; NaN/Inf log-probs at valid positions (the error names the
            tensor and the count); a square that overflows float64.
    """
    check_bool_mask("loss_mask", loss_mask)
    check_tensor("behave_logp", behave_logp, floating=True)
    check_tensor("prox_logp", prox_logp, floating=True)
    check_same_shape("behave_logp", behave_logp, prox_logp=prox_logp, loss_mask=loss_mask)
    d = behave_logp.detach().to(torch.float64) - prox_logp.detach().to(torch.float64)
    m2 = torch.where(loss_mask, d * d, torch.zeros((), dtype=torch.float64, device=d.device))
    if not bool(torch.isfinite(m2).all()):
        for name, t in (("behave_logp", behave_logp), ("prox_logp", prox_logp)):
            n_bad = int((~torch.isfinite(t.detach()) & loss_mask).sum())
            if n_bad:
                raise ValueError(f"{name} has {n_bad} non-finite values at loss_mask positions")
        raise ValueError("(behave_logp - prox_logp)^2 overflows float64 at loss_mask positions")
    return m2


def trust_region_tokens(
    behave_logp: torch.Tensor,
    prox_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
) -> torch.Tensor:
    """The valid tokens in PPO's active trust-region quadrants.

    Args:
        behave_logp: float ``[B, T]`` behaviour log-probs (nats).
        prox_logp: float ``[B, T]`` proximal log-probs (nats).
        advantages: float ``[B, T]`` per-token advantages.
        loss_mask: bool ``[B, T]``, True on valid tokens.
    Returns:
        bool ``[B, T]``: ``loss_mask & ((A > 0 & prox > behave) | (A < 0 & prox < behave))``,
        i.e. ``A > 0, r > 1`` or ``A < 0, r < 1`` with ``r = pi_prox / pi_behave`` (compared on
        the log-probs, exactly). Detached.
    Raises:
        TypeError / ValueError as :func:`m2_per_token`; ValueError for NaN/Inf advantages at
        valid positions (log-probs are checked by :func:`m2_per_token`, which callers run).
    """
    check_bool_mask("loss_mask", loss_mask)
    check_tensor("advantages", advantages, floating=True)
    check_tensor("behave_logp", behave_logp, floating=True)
    check_tensor("prox_logp", prox_logp, floating=True)
    check_same_shape(
        "loss_mask", loss_mask, advantages=advantages, behave_logp=behave_logp, prox_logp=prox_logp
    )
    adv = advantages.detach()
    n_bad = int((~torch.isfinite(adv) & loss_mask).sum())
    if n_bad:
        raise ValueError(f"advantages has {n_bad} non-finite values at loss_mask positions")
    up = prox_logp.detach().to(torch.float64) > behave_logp.detach().to(torch.float64)
    down = prox_logp.detach().to(torch.float64) < behave_logp.detach().to(torch.float64)
    return loss_mask & (((adv > 0) & up) | ((adv < 0) & down))


def m2po_candidates(
    token_set: str,
    behave_logp: torch.Tensor,
    prox_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    advantages: torch.Tensor | None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(in_region, candidates)`` of one batch, both bool ``[B, T]``.

    ``in_region``: :func:`trust_region_tokens` (None without ``advantages``); ``candidates``, the
    tokens the rule may mask: ``loss_mask`` for ``token_set="all"``, ``in_region`` for
    ``"trust_region"`` (which needs ``advantages``).
    """
    check_choice("token_set", token_set, TOKEN_SETS)
    if advantages is None:
        if token_set == "trust_region":
            raise ValueError("token_set='trust_region' needs the advantages")
        return None, loss_mask
    in_region = trust_region_tokens(behave_logp, prox_logp, advantages, loss_mask)
    return in_region, loss_mask if token_set == "all" else in_region


def _exact_sum(values: torch.Tensor) -> Fraction:
    """The exact (rational) sum of a non-empty 1-D float64 tensor, on any device.

    Each value is ``mantissa * 2^exponent`` with an integer 53-bit mantissa; the mantissas are
    summed per exponent in int64 (as two halves, so no partial sum overflows for up to 2^36
    values), then the per-exponent sums (at most ~2,100 of them) are combined exactly.
    """
    mant, exp = torch.frexp(values)
    ints = (mant * 2.0**_MANTISSA_BITS).to(torch.int64)
    exp = exp.to(torch.int64)
    e_min, e_max = torch.stack([exp.min(), exp.max()]).tolist()
    slot = exp - e_min
    high = torch.zeros(e_max - e_min + 1, dtype=torch.int64, device=values.device)
    low = torch.zeros_like(high)
    high.index_add_(0, slot, ints >> _HALF_BITS)
    low.index_add_(0, slot, ints & ((1 << _HALF_BITS) - 1))
    total = 0
    for i, (h, lo) in enumerate(zip(high.tolist(), low.tolist(), strict=True)):
        total += ((h << _HALF_BITS) + lo) << i
    return Fraction(total) * Fraction(2) ** (e_min - _MANTISSA_BITS)


def _check_finite_sum(values: torch.Tensor, abs_total: float) -> None:
    """One-line ValueError when ``abs_total`` (the float64 sum of ``|values|``) is not finite."""
    if not math.isfinite(abs_total):
        n_bad = int((~torch.isfinite(values)).sum())
        if n_bad:
            raise ValueError(f"m2 has {n_bad} non-finite values")
        raise ValueError("the sum of m2 overflows float64")


def _surely_all_kept(values: torch.Tensor, thr: float) -> bool:
    """True when the exact mean of all ``values`` (1-D float64) is certainly below ``thr``
    (the rule keeps everything; the usual case at low staleness). One reduction, one sync."""
    n = values.numel()
    total, abs_total = torch.stack([values.sum(), values.abs().sum()]).tolist()
    _check_finite_sum(values, abs_total)
    slack = 2.0 * _UNIT_ROUNDOFF * n * (abs_total + n * thr) + _ABS_SLACK
    return total - n * thr < -slack


def _n_kept(ascending: torch.Tensor, thr: float) -> int:
    """How many of the smallest values the rule keeps: the largest ``k`` whose exact mean
    ``sum(ascending[:k]) / k`` is below ``thr``, at least 1.

    ``ascending``: 1-D float64 sorted ascending, ``n >= 1`` values. One host sync.
    Raises ValueError when a value is NaN/Inf or the sum overflows float64.
    """
    n = ascending.numel()
    k = torch.arange(1, n + 1, dtype=torch.float64, device=ascending.device)
    k_thr = k * thr
    diff = ascending.cumsum(0).sub_(k_thr)
    abs_sum = ascending.abs().cumsum(0)
    # |computed - exact| of diff is at most ~k u (abs_sum + k thr) for ANY summation order
    # (Higham, Accuracy and Stability, eq. 4.4); 2x that is a safe margin for its sign
    slack = k_thr.add_(abs_sum).mul_(k).mul_(2.0 * _UNIT_ROUNDOFF).add_(_ABS_SLACK)
    # exact mean < thr where surely_below (then also for every smaller k); exact mean >= thr
    # where surely_not (then also for every larger k)
    surely_below = diff < slack.neg()
    surely_not = diff > slack
    lo_t = (k * surely_below).max()
    hi_t = torch.where(surely_not, k, n + 1.0).min()
    lo_f, hi_f, total = torch.stack([lo_t, hi_t, abs_sum[-1]]).tolist()
    _check_finite_sum(ascending, total)
    lo, hi = int(lo_f), int(hi_f)
    if lo >= hi:
        raise AssertionError(f"M2PO error bound violated (lo={lo}, hi={hi})")
    exact_thr = Fraction(thr)
    while hi - lo > 1:  # the mean rounds onto the threshold: decide exactly
        mid = (lo + hi) // 2
        if _exact_sum(ascending[:mid]) < mid * exact_thr:
            lo = mid
        else:
            hi = mid
    return max(lo, 1)


def m2po_keep_mask(m2: torch.Tensor, m2_threshold: float) -> torch.Tensor:
    """The M2PO rule over the valid tokens' second moments.

    Drops the largest values one at a time until the exact mean of the rest is strictly below
    ``m2_threshold``; keeps at least one; among equal values the smaller index is dropped
    first. Values sorted descending give the mask AReaL's ``_get_m2po_loss_mask`` returns.

    Args:
        m2: 1-D float tensor ``[N]`` (nats^2), any float dtype, any device; finite (m2 is a
            square in practice, but any finite floats follow the same rule).
        m2_threshold: finite float > 0.
    Returns:
        bool ``[N]`` on ``m2``'s device, True = keep (an empty input gives an empty mask).
    Raises:
        TypeError: ``m2`` not a float tensor. ValueError: ``m2`` not 1-D, NaN/Inf in ``m2``
        or an overflowing sum, bad threshold.
    """
    check_tensor("m2", m2, floating=True)
    if m2.ndim != 1:
        raise ValueError(f"m2 must be 1-D (the valid tokens' m2), got shape {tuple(m2.shape)}")
    thr = check_m2_threshold(m2_threshold)
    n = m2.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.bool, device=m2.device)
    values = m2.detach().to(torch.float64)
    if _surely_all_kept(values, thr):
        return torch.ones(n, dtype=torch.bool, device=m2.device)
    descending, order = torch.sort(values, descending=True, stable=True)
    n_keep = _n_kept(descending.flip(0), thr)
    keep_sorted = torch.arange(n, device=m2.device) >= n - n_keep
    return torch.empty(n, dtype=torch.bool, device=m2.device).scatter_(0, order, keep_sorted)


def _keep_on_grid(
    m2: torch.Tensor, loss_mask: torch.Tensor, thr: float, candidates: torch.Tensor
) -> torch.Tensor:
    """:func:`m2po_keep_mask` of ``m2[candidates]`` scattered back onto ``loss_mask``'s grid;
    valid tokens outside ``candidates`` are kept, everything outside ``loss_mask`` is False."""
    cand = candidates & loss_mask
    out = loss_mask & ~cand
    values = m2[cand]
    if values.numel():
        out[cand] = m2po_keep_mask(values, thr)
    return out


def m2po_mask(
    behave_logp: torch.Tensor,
    prox_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    m2_threshold: float,
    *,
    advantages: torch.Tensor | None = None,
    token_set: str = "all",
    gather: RankGather | None = None,
    stats_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The M2PO keep mask of one batch and its :func:`m2po_stats`, m2 computed once.

    With ``gather`` the batch is this rank's share of one spread over ranks: every rank gathers
    the m2 of every valid token and whether it is a candidate (rank-major order; one
    collective), applies the rule to the concatenated candidates and keeps its own slice, so
    the mask equals the rule applied to the concatenated batch, and the stats are the global
    ones.

    Args:
        behave_logp: float ``[B, T]`` behaviour log-probs recorded at generation.
        prox_logp: float ``[B, T]`` proximal log-probs recomputed at step start.
        loss_mask: bool ``[B, T]`` valid tokens.
        m2_threshold: finite float > 0.
        advantages: float ``[B, T]``; needed by ``token_set="trust_region"`` and, when given,
            adds the quadrant statistics.
        token_set: one of :data:`TOKEN_SETS`.
        gather: gathers across ranks (None: this batch alone).
        stats_dtype: dtype of the returned statistics.
    Returns:
        ``(keep, stats)``: bool ``[B, T]``, the rule over the candidates' :func:`m2_per_token`
        (row-major order), True on the valid non-candidates, False outside ``loss_mask``; and
        the :func:`m2po_stats` (of ``stats_dtype``).
    Raises:
        the errors of :func:`m2_per_token`, :func:`trust_region_tokens` and
        :func:`check_m2_threshold`.
    """
    thr = check_m2_threshold(m2_threshold)
    m2 = m2_per_token(behave_logp, prox_logp, loss_mask)
    in_region, candidates = m2po_candidates(
        token_set, behave_logp, prox_logp, loss_mask, advantages
    )
    if gather is None:
        return m2po_mask_of_m2(
            m2, loss_mask, thr, candidates, in_region=in_region, stats_dtype=stats_dtype
        )
    m2_local = m2[loss_mask]
    # one collective: the m2 values, then 0/1 flags (candidate, in quadrant)
    flags = [candidates[loss_mask]] + ([] if in_region is None else [in_region[loss_mask]])
    parts, rank = gather(torch.cat([m2_local] + [f.to(torch.float64) for f in flags]))
    n_rows = 1 + len(flags)
    rows = [torch.cat([p.view(n_rows, -1)[i] for p in parts]) for i in range(n_rows)]
    m2_all, cand_all = rows[0], rows[1] > 0.5
    region_all = rows[2] > 0.5 if in_region is not None else None
    keep_all, stats = m2po_mask_of_m2(
        m2_all,
        torch.ones_like(cand_all),
        thr,
        cand_all,
        in_region=region_all,
        stats_dtype=stats_dtype,
    )
    offset = sum(p.numel() for p in parts[:rank]) // n_rows
    keep = torch.zeros_like(loss_mask)
    keep[loss_mask] = keep_all[offset : offset + m2_local.numel()]
    return keep, stats


def m2po_mask_of_m2(
    m2: torch.Tensor,
    loss_mask: torch.Tensor,
    m2_threshold: float,
    candidates: torch.Tensor,
    *,
    in_region: torch.Tensor | None = None,
    stats_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The second half of :func:`m2po_mask`, for callers that hold the m2 values already
    (e.g. gathered from every rank as 1-D vectors): the keep mask and :func:`m2po_stats`.

    Args:
        m2: float ``[...]`` per-token m2 (nats^2), finite on ``loss_mask``.
        loss_mask, candidates: bool, ``m2``'s shape (:func:`m2po_candidates`).
        m2_threshold: finite float > 0.
        in_region: optional bool, ``m2``'s shape (:func:`trust_region_tokens`).
        stats_dtype: dtype of the returned statistics.
    """
    thr = check_m2_threshold(m2_threshold)
    keep = _keep_on_grid(m2, loss_mask, thr, candidates)
    return keep, m2po_stats(m2, loss_mask, keep, thr, in_region=in_region, dtype=stats_dtype)


def _mean(values: torch.Tensor) -> torch.Tensor:
    """The mean of a float64 vector; 0 when empty."""
    return values.mean() if values.numel() else torch.zeros((), dtype=values.dtype)


def m2po_stats(
    m2: torch.Tensor,
    loss_mask: torch.Tensor,
    keep_mask: torch.Tensor,
    m2_threshold: float,
    *,
    in_region: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """M2PO diagnostics for one (micro-)batch, computed in float64.

    Args:
        m2: float ``[B, T]`` (or any shape) per-token second moment (values outside
            ``loss_mask`` ignored).
        loss_mask: bool, ``m2``'s shape, valid tokens; keep_mask: bool M2PO keep mask.
        m2_threshold: the threshold used.
        in_region: optional bool, the :func:`trust_region_tokens`.
        dtype: dtype of the returned values (float32 for the loss path's stats; float64 keeps
            the exact means).
    Returns:
        Detached 0-dim tensors of ``dtype``: ``m2po/masked_fraction`` (masked / valid),
        ``m2po/m2_before`` (mean m2 over valid), ``m2po/m2_after`` (mean m2 over kept),
        ``m2po/threshold``, ``m2po/n_masked``, ``m2po/n_valid`` (counts); with ``in_region``
        also ``m2po/trust_region_fraction`` (in-quadrant / valid), ``m2po/m2_before_trust_region``
        and ``m2po/m2_after_trust_region`` (mean m2 over the in-quadrant valid tokens, all / kept).
        All 0 when empty.
    """
    check_tensor("m2", m2, floating=True)
    check_bool_mask("loss_mask", loss_mask)
    check_bool_mask("keep_mask", keep_mask)
    check_same_shape("loss_mask", loss_mask, m2=m2, keep_mask=keep_mask)
    thr = check_m2_threshold(m2_threshold)
    m2_64 = m2.detach().to(torch.float64)
    kept = keep_mask & loss_mask
    n_valid = loss_mask.sum().to(torch.float64)
    n_masked = n_valid - kept.sum().to(torch.float64)
    stats = {
        "m2po/masked_fraction": n_masked / n_valid.clamp(min=1),
        "m2po/m2_before": _mean(m2_64[loss_mask]),
        "m2po/m2_after": _mean(m2_64[kept]),
        "m2po/threshold": torch.tensor(thr, dtype=torch.float64),
        "m2po/n_masked": n_masked,
        "m2po/n_valid": n_valid,
    }
    if in_region is not None:
        check_bool_mask("in_region", in_region)
        check_same_shape("loss_mask", loss_mask, in_region=in_region)
        region = in_region & loss_mask
        n_region = region.sum().to(torch.float64)
        stats["m2po/trust_region_fraction"] = n_region / n_valid.clamp(min=1)
        stats["m2po/m2_before_trust_region"] = _mean(m2_64[region])
        stats["m2po/m2_after_trust_region"] = _mean(m2_64[region & keep_mask])
    return {k: v.detach().to(device=m2.device, dtype=dtype).reshape(()) for k, v in stats.items()}
