"""Normalisation of rewards and advantages: GRPO group / batch mean and std, RLOO's
leave-one-out mean, over sequences or over valid tokens.

One normaliser: :func:`normalization_stats` takes the mean and std of the masked elements of
``[B, T]`` rows at the batch or group level; :func:`masked_normalize` (token level, ``[B, T]``
with a ``torch.bool`` mask) and :func:`group_normalize` (one scalar per sequence, ``[B]``) divide
by them, and AReaL's ``Normalization`` and ``masked_normalization`` (``areal_m2po.areal``) are
adapters over it. Groups are consecutive blocks of ``group_size`` sequences (or of the sizes
given). The module imports only torch,
:mod:`areal_m2po.algo.options` and :mod:`areal_m2po.algo.checks`; it keeps no state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from areal_m2po.algo.checks import check_bool_mask, check_choice, check_same_shape, check_tensor
from areal_m2po.algo.options import NORM_LEVELS

__all__ = ["group_normalize", "masked_normalize", "normalization_stats"]


def _check_norm_args(
    mean_level: str | None,
    std_level: str | None,
    group_size: int | None,
    batch: int,
    mean_leave1out: bool,
) -> int | None:
    check_choice("mean_level", mean_level, NORM_LEVELS)
    check_choice("std_level", std_level, NORM_LEVELS)
    if mean_leave1out and mean_level is None:
        raise ValueError("mean_leave1out=True requires mean_level 'batch' or 'group'")
    if "group" in (mean_level, std_level):
        if group_size is None or isinstance(group_size, bool) or not isinstance(group_size, int):
            raise ValueError(
                f"group_size must be a positive int for group level, got {group_size!r}"
            )
        if group_size <= 0:
            raise ValueError(f"group_size must be a positive int, got {group_size}")
        if batch % group_size != 0:
            raise ValueError(f"batch size {batch} is not divisible by group_size {group_size}")
    return group_size


def group_normalize(
    x: torch.Tensor,
    mean_level: str | None = "group",
    std_level: str | None = "group",
    group_size: int | None = None,
    mean_leave1out: bool = False,
    std_unbiased: bool = True,
    eps: float = 1e-5,
) -> torch.Tensor:
    """GRPO/RLOO-style normalisation of per-sequence scalars.

    Groups are consecutive blocks of ``group_size`` sequences (the samples of one prompt).
    ``out = (x - mean) / (std + eps)``; ``mean_level=None`` skips centring,
    ``std_level=None`` skips scaling (and ``eps``). ``mean_leave1out`` uses, for each
    element, the mean of the OTHER elements of its batch/group (RLOO baseline). ``std`` is
    the spread at ``std_level`` of the centred values ``c = x - mean`` around 0,
    ``sqrt(sum c^2 / (n - 1))`` (unbiased by default; ``n`` in the denominator otherwise; 0
    when a level has a single element), as AReaL computes it: with equal levels and a plain
    mean this is the usual std of ``x``; without centring it is the root mean square of ``x``;
    with a group mean and a batch std it is the pooled within-group spread.

    Args:
        x: float ``[B]``.
        group_size: required when a level is "group"; ``B % group_size`` must be 0.
    Returns:
        float ``[B]`` of ``x``'s dtype (computed in float64).
    """
    check_tensor("x", x, floating=True)
    if x.ndim != 1:
        raise ValueError(f"x must be 1-D [B], got shape {tuple(x.shape)}")
    batch = x.shape[0]
    gs = _check_norm_args(mean_level, std_level, group_size, batch, mean_leave1out)
    if batch == 0:
        return x.clone()
    if mean_leave1out and (batch if mean_level == "batch" else gs or batch) < 2:
        raise ValueError("mean_leave1out needs at least 2 elements per batch/group")
    rows = x[:, None]
    out = masked_normalize(
        rows, torch.ones_like(rows, dtype=torch.bool), mean_level, std_level, group_size,
        mean_leave1out, std_unbiased, eps,
    )  # fmt: skip
    return out[:, 0]


def masked_normalize(
    x: torch.Tensor,
    mask: torch.Tensor,
    mean_level: str | None = "batch",
    std_level: str | None = "batch",
    group_size: int | None = None,
    mean_leave1out: bool = False,
    std_unbiased: bool = True,
    eps: float = 1e-5,
    batch_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Token-level variant of :func:`group_normalize` (e.g. ``adv_norm`` on token advantages).

    Statistics are taken over the valid tokens of the whole batch ("batch") or of the
    group's ``group_size`` consecutive sequences ("group"). Leave-one-out excludes the token
    itself. The std is that of the centred values around 0, as in :func:`group_normalize`.
    Positions outside ``mask`` are 0 in the output.

    Args:
        x: float ``[B, T]``; mask: bool ``[B, T]``.
        batch_sum: sums a 0-dim float64 tensor over the shards of a batch split across
            processes (e.g. an all-reduce), so "batch" statistics cover the global batch;
            None = this tensor is the whole batch.
    Returns:
        float ``[B, T]`` of ``x``'s dtype (computed in float64).
    """
    check_tensor("x", x, floating=True)
    check_bool_mask("mask", mask)
    check_same_shape("x", x, mask=mask)
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D [B, T], got shape {tuple(x.shape)}")
    batch = x.shape[0]
    gs = _check_norm_args(mean_level, std_level, group_size, batch, mean_leave1out)
    if x.numel() == 0:
        return torch.zeros_like(x)
    x64 = torch.where(mask, x.detach().to(torch.float64), 0.0)
    mean, std = normalization_stats(
        x64, mask, mean_level, std_level, gs or batch, mean_leave1out, std_unbiased, batch_sum
    )
    out = x64 if mean is None else x64 - mean
    if std is not None:
        out = out / (std + eps)
    return torch.where(mask, out, 0.0).to(x.dtype)


def _pooler(
    batch: int, groups: int | list[int], batch_sum: Callable[[torch.Tensor], torch.Tensor] | None
) -> Callable[[torch.Tensor, str], torch.Tensor]:
    """``pool(row_stat [B], level) -> [B, 1]``: the sum of a per-row statistic over the row's
    batch or group (consecutive blocks of ``groups`` rows, or of the sizes ``groups`` lists)."""

    def pool(row_stat: torch.Tensor, level: str) -> torch.Tensor:
        if level == "batch":
            total = row_stat.sum() if batch_sum is None else batch_sum(row_stat.sum())
            return total.expand(batch).unsqueeze(1)
        if isinstance(groups, int):
            return row_stat.view(-1, groups).sum(dim=1).repeat_interleave(groups).unsqueeze(1)
        sums = torch.stack([part.sum() for part in row_stat.split(groups)])
        sizes = torch.tensor(groups, device=row_stat.device)
        return sums.repeat_interleave(sizes).unsqueeze(1)

    return pool


def normalization_stats(
    x: torch.Tensor,
    mask: torch.Tensor,
    mean_level: str | None,
    std_level: str | None,
    groups: int | list[int],
    mean_leave1out: bool = False,
    std_unbiased: bool = True,
    batch_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    degenerate_std: float = 0.0,
    adjust_mean: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The mean and std of the masked elements of ``x`` at each row's level (unchecked).

    Args:
        x: float ``[B, T]``, 0 outside ``mask`` (its dtype is the statistics' dtype);
            mask: bool ``[B, T]``.
        groups: rows per group, or the list of group sizes (summing to ``B``).
        mean_leave1out: each element's mean leaves it out (``(s - x) / max(n - 1, 1)``).
        std_unbiased: divide the sum of squares by ``n - 1`` (else ``n``); where that is not
            positive the std is ``degenerate_std``.
        batch_sum: sums a 0-dim tensor over the processes sharing the batch (None: local).
        adjust_mean: rewrites the mean before the std is taken around it (an adapter's rule).
    Returns:
        ``(mean, std)``: mean ``[B, T]`` (leave-one-out) or ``[B, 1]``, None without
        ``mean_level``; std ``[B, 1]`` of the centred values ``x - mean`` around 0, None
        without ``std_level``.
    """
    pool = _pooler(x.shape[0], groups, batch_sum)
    cnt_row = mask.sum(dim=1).to(x.dtype)
    mean = None
    if mean_level is not None:
        s = pool(x.sum(dim=1), mean_level)
        n = pool(cnt_row, mean_level)
        mean = (s - x) / (n - 1).clamp(min=1) if mean_leave1out else s / n.clamp(min=1)
        if adjust_mean is not None:
            mean = adjust_mean(mean)
    if std_level is None:
        return mean, None
    # the spread of the centred values (as AReaL): around the mean actually subtracted
    n = pool(cnt_row, std_level)
    dev = x if mean is None else torch.where(mask, x - mean, 0.0)
    ss = pool((dev * dev).sum(dim=1), std_level)
    denom = (n - 1) if std_unbiased else n
    std = torch.where(denom > 0, (ss / denom.clamp(min=1)).sqrt(), degenerate_std)
    return mean, std
