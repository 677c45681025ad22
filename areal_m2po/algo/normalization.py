"""Normalisation of rewards and advantages: GRPO group / batch mean and std, RLOO's
leave-one-out mean, over sequences or over valid tokens.

Owns :func:`group_normalize` (one scalar per sequence, ``[B]``) and :func:`masked_normalize`
(its token-level variant over ``[B, T]`` with a ``torch.bool`` mask); groups are consecutive
blocks of ``group_size`` sequences. The module imports only torch,
:mod:`areal_m2po.algo.options` and :mod:`areal_m2po.algo.checks`; it keeps no state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from areal_m2po.algo.checks import check_bool_mask, check_choice, check_same_shape, check_tensor
from areal_m2po.algo.options import NORM_LEVELS

__all__ = ["group_normalize", "masked_normalize"]


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
    gsz = gs if gs is not None else batch
    x64 = x.detach().to(torch.float64)

    def _view(level: str) -> torch.Tensor:
        size = batch if level == "batch" else gsz
        return x64.view(batch // size, size)

    out = x64
    if mean_level is not None:
        v = _view(mean_level)
        n = v.shape[1]
        s = v.sum(dim=1, keepdim=True)
        if mean_leave1out:
            if n < 2:
                raise ValueError("mean_leave1out needs at least 2 elements per batch/group")
            mean = (s - v) / (n - 1)
        else:
            mean = s / n
        out = (v - mean).reshape(batch)
    if std_level is not None:
        # the spread of the centred values (as AReaL): around the mean actually subtracted
        size = batch if std_level == "batch" else gsz
        dev = out.view(batch // size, size)
        n = size
        denom = n - 1 if std_unbiased else n
        var = (
            (dev * dev).sum(dim=1, keepdim=True) / denom
            if denom > 0
            else torch.zeros_like(dev[:, :1])
        )
        std = var.sqrt().expand_as(dev).reshape(batch)
        out = out / (std + eps)
    return out.to(x.dtype)


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
    gsz = gs if gs is not None else batch
    x64 = torch.where(mask, x.detach().to(torch.float64), 0.0)
    cnt_row = mask.sum(dim=1).to(torch.float64)
    sum_row = x64.sum(dim=1)

    def _pool(row_stat: torch.Tensor, level: str) -> torch.Tensor:
        """Pool a per-row statistic over the level, broadcast back to [B, 1]."""
        if level == "batch":
            total = row_stat.sum() if batch_sum is None else batch_sum(row_stat.sum())
            return total.expand(batch).unsqueeze(1)
        return row_stat.view(-1, gsz).sum(dim=1).repeat_interleave(gsz).unsqueeze(1)

    out = x64
    if mean_level is not None:
        s = _pool(sum_row, mean_level)
        n = _pool(cnt_row, mean_level)
        if mean_leave1out:
            mean = (s - x64) / (n - 1).clamp(min=1)
        else:
            mean = s / n.clamp(min=1)
        out = x64 - mean
    if std_level is not None:
        # the spread of the centred values (as AReaL): around the mean actually subtracted
        n = _pool(cnt_row, std_level)
        dev = torch.where(mask, out, 0.0)
        ss = _pool((dev * dev).sum(dim=1), std_level)
        denom = (n - 1) if std_unbiased else n
        var = torch.where(denom > 0, ss / denom.clamp(min=1), torch.zeros_like(ss))
        out = out / (var.sqrt() + eps)
    return torch.where(mask, out, 0.0).to(x.dtype)
