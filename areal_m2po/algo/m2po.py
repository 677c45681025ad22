"""M2PO masking: the rule, its token sets, its input checks and its diagnostics.

M2PO (second-moment trust policy optimisation) masks, before the policy loss, the valid tokens
whose behaviour-vs-proximal log-ratio has an outsized second moment:

* per valid token: ``m2 = (behave_logp - prox_logp)^2`` in nats^2, in float64;
* the rule (the paper's Algorithm 1, AReaL's ``_apply_m2po_masking``): sort the candidates' m2
  descending and drop the largest, one at a time, until the mean m2 of the tokens left is
  strictly below ``m2_threshold``; keep at least one; among equal values the smaller index goes
  first. One stable sort and one float64 cumulative sum give every suffix mean at once; a suffix
  mean within float64 rounding of the threshold is decided by its float64 value, as in AReaL.

Token sets (``actor.m2_token_set``): ``all`` (AReaL's, the default) takes every valid token as a
candidate; ``trust_region`` (the paper's final version, as Trinity-RFT PR #616 and ms-swift PR
#9965 implement it) only the valid tokens in PPO's active trust-region quadrants, ``A > 0 and
r > 1`` or ``A < 0 and r < 1`` with ``r = pi_prox / pi_behave``; the other valid tokens are kept.
Per-token tensors are ``[B, T]``, ``loss_mask`` bool; imports torch and the algo package only.
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
    """One-line errors unless ``loss_mask`` is bool, ``tensors`` float, all of one shape."""
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
    """The rule on a 1-D float ``m2`` ``[N]``: bool ``[N]``, True = keep (AReaL's
    ``_get_m2po_loss_mask`` of ``m2`` sorted descending). One-line errors for a non-float or
    non-1-D ``m2``, NaN/Inf in it, a sum that overflows float64, a bad threshold."""
    checks.check_tensor("m2", m2, floating=True)
    if m2.ndim != 1:
        raise ValueError(f"m2 must be 1-D (the valid tokens' m2), got shape {tuple(m2.shape)}")
    thr = check_m2_threshold(m2_threshold)
    if (n := m2.numel()) == 0:
        return torch.zeros(0, dtype=torch.bool, device=m2.device)
    values = m2.detach().double() + 0.0  # -0.0 becomes 0.0: equal values, equal keys
    bits = values.view(torch.int64)  # IEEE bits, made monotone, then reversed: an int64 key
    key = torch.where(bits < 0, bits ^ (2**63 - 1), bits).bitwise_not_()
    # its stable ascending sort is the values' stable descending sort, several times faster
    order = torch.sort(key, stable=True).indices
    descending = values[order]
    count = torch.arange(1, n + 1, dtype=torch.float64, device=m2.device)
    sums = descending.flip(0).cumsum(0)  # sums[k - 1]: of the k smallest, the suffix kept
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
    merged = [torch.cat([r[i] for r in rows]).to(c.dtype) for i, c in enumerate(columns)]
    return merged, slice(start, start + columns[0].numel())


def m2po_mask(
    behave_logp: Tensor,
    prox_logp: Tensor,
    loss_mask: Tensor,
    m2_threshold: float,
    *,
    advantages: Tensor | None = None,
    token_set: str = "all",
    gather: RankGather | None = None,
    stats_dtype: torch.dtype | None = torch.float32,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The keep mask, bool ``[B, T]``, of one batch (the rule over the candidates' m2 in
    row-major order, True on the other valid tokens, False outside ``loss_mask``) and its
    :func:`m2po_stats` (``stats_dtype``; None: an empty dict). ``advantages`` (``[B, T]``) are
    needed by ``token_set="trust_region"`` and add the quadrant stats. With ``gather``, mask and
    stats are those of the batch concatenated over ranks (this rank's share is ``[B, T]``)."""
    thr = check_m2_threshold(m2_threshold)
    m2 = m2_per_token(behave_logp, prox_logp, loss_mask)
    checks.check_choice("token_set", token_set, TOKEN_SETS)
    region = None
    if advantages is not None:
        region = trust_region_tokens(behave_logp, prox_logp, advantages, loss_mask)
    elif token_set == "trust_region":
        raise ValueError("token_set='trust_region' needs the advantages")
    columns = [m2[loss_mask]] + ([] if region is None else [region[loss_mask]])
    mine = slice(None)
    if gather is not None:
        columns, mine = _gathered(columns, gather)
    values, region = columns[0], (columns[1] if region is not None else None)
    if region is not None and token_set == "trust_region":  # only its tokens are candidates
        keep = ~region
        keep[region] = m2po_keep_mask(values[region], thr)
    else:
        keep = m2po_keep_mask(values, thr)
    out = torch.zeros_like(loss_mask)
    out[loss_mask] = keep[mine]
    valid = torch.ones_like(keep)
    stats = {} if stats_dtype is None else m2po_stats(values, valid, keep, thr, region, stats_dtype)
    return out, stats


def m2po_stats(
    m2: Tensor,
    loss_mask: Tensor,
    keep_mask: Tensor,
    m2_threshold: float,
    in_region: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, Tensor]:
    """M2PO diagnostics in float64, as detached 0-dim tensors of ``dtype`` (0 when empty):
    ``m2po/masked_fraction`` (masked / valid), ``m2po/m2_before`` / ``m2po/m2_after`` (mean m2
    over valid / kept), ``m2po/threshold``, ``m2po/n_masked``, ``m2po/n_valid``; with
    ``in_region``: ``m2po/trust_region_fraction``, ``m2po/m2_before_trust_region``,
    ``m2po/m2_after_trust_region``. ``m2`` (nats^2; ignored outside ``loss_mask``) and the bool
    masks share one shape."""
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
        "m2po/threshold": torch.tensor(
            check_m2_threshold(m2_threshold), dtype=torch.float64, device=m2.device
        ),
        "m2po/n_masked": n_masked,
        "m2po/n_valid": n_valid,
    }
    if in_region is not None:
        region = checks.check_bool_mask("in_region", in_region) & loss_mask
        stats["m2po/trust_region_fraction"] = region.sum().double() / n_valid.clamp(min=1)
        stats["m2po/m2_before_trust_region"] = m2_64[region].mean().nan_to_num()
        stats["m2po/m2_after_trust_region"] = m2_64[region & keep_mask].mean().nan_to_num()
    return {k: v.detach().to(device=m2.device, dtype=dtype).reshape(()) for k, v in stats.items()}
