"""M2PO masking: the rule, its token sets, its input checks and its diagnostics.

M2PO (second-moment trust policy optimisation) masks, before the policy loss, the valid tokens
whose behaviour-vs-proximal log-ratio has an outsized second moment:

* per valid token: ``m2 = (behave_logp - prox_logp)^2`` in nats^2, in float64 (float32
  log-probs are upcast exactly before the difference);
* the rule (the paper's Algorithm 1, AReaL's ``_apply_m2po_masking``): sort the candidates' m2
  descending and drop the largest, one at a time, until the mean m2 of the tokens left is
  strictly below ``m2_threshold``; keep at least one; among equal values the smaller index goes
  first. One stable sort and one float64 cumulative sum give every suffix mean at once; a suffix
  mean within float64 rounding of the threshold is decided by its float64 value, as in AReaL.

Token sets (``actor.m2_token_set``): ``all`` (AReaL's, the default) takes every valid token as a
candidate; ``trust_region`` (the paper's final version, as Trinity-RFT PR #616 and ms-swift PR
#9965 implement it) only the valid tokens in PPO's active trust-region quadrants, ``A > 0 and
r > 1`` or ``A < 0 and r < 1`` with ``r = pi_prox / pi_behave``; the other valid tokens are kept.
Per-token tensors are ``[B, T]``, ``loss_mask`` is ``torch.bool`` (True on valid tokens).
Imports torch and :mod:`areal_m2po.algo` only; keeps no state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from areal_m2po.algo import checks
from areal_m2po.algo.options import M2_TOKEN_SETS as TOKEN_SETS

RankGather = Callable[[Tensor], tuple[list[Tensor], int]]
"""``gather(t) -> (every rank's 1-D t in rank order, lengths may differ; this rank's index)``."""


def check_m2_threshold(m2_threshold: Any) -> float:
    """``m2_threshold`` as a float; a one-line ValueError unless it is finite and > 0."""
    thr = None if m2_threshold is None else checks.check_real("m2_threshold", m2_threshold)
    if thr is None or not math.isfinite(thr) or thr <= 0.0:
        raise ValueError(f"m2_threshold must be a positive finite number, got {thr}")
    return thr


def _check_inputs(loss_mask: Tensor, **tensors: Tensor) -> None:
    """A one-line TypeError/ValueError unless ``loss_mask`` is bool and ``tensors`` float, all
    of the first tensor's shape."""
    checks.check_bool_mask("loss_mask", loss_mask)
    for name, t in tensors.items():
        checks.check_tensor(name, t, floating=True)
    (ref_name, ref), *_ = tensors.items()
    checks.check_same_shape(ref_name, ref, **tensors, loss_mask=loss_mask)


def m2_per_token(behave_logp: Tensor, prox_logp: Tensor, loss_mask: Tensor) -> Tensor:
    """float64 ``[B, T]`` ``(behave_logp - prox_logp)^2`` in nats^2 (log-probs float ``[B, T]``),
    0 outside ``loss_mask`` whatever the log-probs hold there; detached. One-line errors of
    :func:`_check_inputs`, for NaN/Inf log-probs at valid positions and an overflowing square."""
    _check_inputs(loss_mask, behave_logp=behave_logp, prox_logp=prox_logp)
    d = behave_logp.detach().double() - prox_logp.detach().double()
    m2 = torch.where(loss_mask, d * d, 0.0)
    if not bool(torch.isfinite(m2).all()):
        for name, t in (("behave_logp", behave_logp), ("prox_logp", prox_logp)):
            n_bad = int((~torch.isfinite(t.detach()) & loss_mask).sum())
            if n_bad:
                raise ValueError(f"{name} has {n_bad} non-finite values at loss_mask positions")
        raise ValueError("(behave_logp - prox_logp)^2 overflows float64 at loss_mask positions")
    return m2


def trust_region_tokens(
    behave_logp: Tensor, prox_logp: Tensor, advantages: Tensor, loss_mask: Tensor
) -> Tensor:
    """bool ``[B, T]``: the valid tokens with ``A > 0 and prox > behave`` or ``A < 0 and
    prox < behave`` (log-probs compared exactly); detached. All inputs ``[B, T]``; ValueError
    for NaN/Inf advantages at valid positions (the log-probs are :func:`m2_per_token`'s)."""
    _check_inputs(loss_mask, behave_logp=behave_logp, prox_logp=prox_logp, advantages=advantages)
    adv = advantages.detach()
    n_bad = int((~torch.isfinite(adv) & loss_mask).sum())
    if n_bad:
        raise ValueError(f"advantages has {n_bad} non-finite values at loss_mask positions")
    d = prox_logp.detach().double() - behave_logp.detach().double()
    return loss_mask & (((adv > 0) & (d > 0)) | ((adv < 0) & (d < 0)))


def m2po_keep_mask(m2: Tensor, m2_threshold: float) -> Tensor:
    """The rule on a 1-D float ``m2`` ``[N]`` (any dtype, any device): bool ``[N]``, True =
    keep; on ``m2`` sorted descending, AReaL's ``_get_m2po_loss_mask``. One-line errors for a
    non-float or non-1-D ``m2``, NaN/Inf in it, a sum that overflows float64, a bad threshold."""
    checks.check_tensor("m2", m2, floating=True)
    if m2.ndim != 1:
        raise ValueError(f"m2 must be 1-D (the valid tokens' m2), got shape {tuple(m2.shape)}")
    thr = check_m2_threshold(m2_threshold)
    if (n := m2.numel()) == 0:
        return torch.zeros(0, dtype=torch.bool, device=m2.device)
    descending, order = torch.sort(m2.detach().double(), descending=True, stable=True)
    # means[k - 1]: the mean of the k smallest values, i.e. of the suffix that drops n - k
    count = torch.arange(1, n + 1, dtype=torch.float64, device=m2.device)
    sums = descending.flip(0).cumsum(0)
    n_keep = torch.where(sums / count < thr, count, 1.0).max()
    total, k = torch.stack([sums[-1], n_keep]).tolist()
    if not math.isfinite(total):  # NaN/Inf values or an overflowing sum
        n_bad = int((~torch.isfinite(m2)).sum())
        raise ValueError(
            f"m2 has {n_bad} non-finite values" if n_bad else "the sum of m2 overflows float64"
        )
    keep_sorted = torch.arange(n, device=m2.device) >= n - int(k)
    return torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted)


def _gathered(columns: list[Tensor], gather: RankGather) -> tuple[list[Tensor], slice]:
    """Every rank's ``columns`` (1-D, one per-token quantity each) concatenated in rank order
    with one collective, and this rank's slice of them."""
    parts, rank = gather(torch.cat([c.double() for c in columns]))
    rows = [p.view(len(columns), -1) for p in parts]
    start = sum(r.shape[1] for r in rows[:rank])
    merged = [torch.cat([r[i] for r in rows]) for i in range(len(columns))]
    mine = slice(start, start + columns[0].numel())
    return [m.to(c.dtype) for m, c in zip(merged, columns, strict=True)], mine


def m2po_mask(
    behave_logp: Tensor,
    prox_logp: Tensor,
    loss_mask: Tensor,
    m2_threshold: float,
    *,
    advantages: Tensor | None = None,
    token_set: str = "all",
    gather: RankGather | None = None,
    stats_dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The M2PO keep mask, bool ``[B, T]``, of one batch and its :func:`m2po_stats` (0-dim,
    ``stats_dtype``): the rule over the candidates' m2 in row-major order, True on the other
    valid tokens, False outside ``loss_mask``. ``advantages`` (float ``[B, T]``) are needed by
    ``token_set="trust_region"`` and add the quadrant stats. With ``gather`` the batch is this
    rank's share of one spread over ranks: mask and stats are those of the concatenated batch
    (rank-major order). Raises the errors of the checks above."""
    thr = check_m2_threshold(m2_threshold)
    m2 = m2_per_token(behave_logp, prox_logp, loss_mask)
    checks.check_choice("token_set", token_set, TOKEN_SETS)
    region = None
    if advantages is not None:
        region = trust_region_tokens(behave_logp, prox_logp, advantages, loss_mask)
    elif token_set == "trust_region":
        raise ValueError("token_set='trust_region' needs the advantages")
    cand = region if token_set == "trust_region" else loss_mask
    columns = [m2[loss_mask]] + [f[loss_mask] for f in (cand, region) if f is not None]
    mine = slice(None)
    if gather is not None:
        columns, mine = _gathered(columns, gather)
    values, cand_v, *rest = columns
    keep = ~cand_v
    keep[cand_v] = m2po_keep_mask(values[cand_v], thr)
    all_valid, region_v = torch.ones_like(keep), rest[0] if rest else None
    stats = m2po_stats(values, all_valid, keep, thr, in_region=region_v, dtype=stats_dtype)
    out = torch.zeros_like(loss_mask)
    out[loss_mask] = keep[mine]
    return out, stats


def m2po_stats(
    m2: Tensor,
    loss_mask: Tensor,
    keep_mask: Tensor,
    m2_threshold: float,
    *,
    in_region: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Tensor]:
    """M2PO diagnostics, computed in float64, as detached 0-dim tensors of ``dtype`` (all 0 when
    empty): ``m2po/masked_fraction`` (masked / valid), ``m2po/m2_before`` / ``m2po/m2_after``
    (mean m2 over valid / kept), ``m2po/threshold``, ``m2po/n_masked``, ``m2po/n_valid``; with
    ``in_region`` (:func:`trust_region_tokens`) also ``m2po/trust_region_fraction``,
    ``m2po/m2_before_trust_region`` and ``m2po/m2_after_trust_region``. ``m2`` (nats^2, values
    outside ``loss_mask`` ignored) and the bool masks share one shape."""
    checks.check_tensor("m2", m2, floating=True)
    for name, t in (("loss_mask", loss_mask), ("keep_mask", keep_mask)):
        checks.check_bool_mask(name, t)
    checks.check_same_shape("loss_mask", loss_mask, m2=m2, keep_mask=keep_mask, in_region=in_region)
    m2_64 = m2.detach().double()
    kept = keep_mask & loss_mask
    n_valid = loss_mask.sum().double()
    n_masked = n_valid - kept.sum().double()
    stats = {
        "m2po/masked_fraction": n_masked / n_valid.clamp(min=1),
        "m2po/m2_before": m2_64[loss_mask].mean().nan_to_num(),
        "m2po/m2_after": m2_64[kept].mean().nan_to_num(),
        "m2po/threshold": torch.tensor(check_m2_threshold(m2_threshold), dtype=torch.float64),
        "m2po/n_masked": n_masked,
        "m2po/n_valid": n_valid,
    }
    if in_region is not None:
        region = checks.check_bool_mask("in_region", in_region) & loss_mask
        stats["m2po/trust_region_fraction"] = region.sum().double() / n_valid.clamp(min=1)
        stats["m2po/m2_before_trust_region"] = m2_64[region].mean().nan_to_num()
        stats["m2po/m2_after_trust_region"] = m2_64[region & keep_mask].mean().nan_to_num()
    return {k: v.detach().to(device=m2.device, dtype=dtype).reshape(()) for k, v in stats.items()}
