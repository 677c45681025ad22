"""AReaL's ``Normalization``, ``masked_normalization`` and ``KLEstimator`` (areal-project/AReaL
cbff54d6, ``areal/utils/data.py`` and ``areal/utils/functional/functional.py``): adapters over
this package's one normaliser, :func:`areal_m2po.algo.normalization.normalization_stats`, and
its KL estimator :func:`areal_m2po.algo.kl.kl_estimate`.

What the adapters add to the package's normaliser (its statistics are the same: means over
the masked elements, the std of the centred values around 0, leave-one-out means):

* ``[B]`` or ``[B, T]`` inputs, an optional mask, float32 out; statistics in float64 unless
  ``high_precision=False``; batch sums all-reduced over ``reduce_group`` when a process group
  is initialised;
* ``Normalization``: groups of ``group_size`` rows or of ``group_sizes[i]`` rows (a
  ``group_size`` that does not divide the batch is refused, where AReaL leaves the last rows
  unnormalised); where a std has no degree of freedom it is 1 (the package's is 0); a one-row
  group's leave-one-out mean is the row itself and its unbiased std is 1; an all-masked input
  comes back unchanged;
* ``masked_normalization``: the statistics over ``dim`` (all dims by default); every position,
  masked-out ones included, is ``(x * mask - mean) / (std + eps)``; the std is biased unless
  ``unbiased``; where AReaL divides by a zero count the std here is 0; the sums of a ``dim``
  that is not all dims are not all-reduced.

Imports torch and :mod:`areal_m2po.algo` only; keeps no state beyond the options.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from areal_m2po.algo.kl import kl_estimate
from areal_m2po.algo.normalization import normalization_stats

__all__ = ["KLEstimator", "Normalization", "masked_normalization"]


class KLEstimator:
    """``KLEstimator(kl_estimator="k1", apply_clamp=True)(log_probs, log_probs_base)``: the
    per-token k1/k2/k3 estimate (:func:`~areal_m2po.algo.kl.kl_estimate`) in float32, of
    ``log_probs``' shape, clamped to [-10, 10] unless ``apply_clamp=False``."""

    def __init__(self, kl_estimator: str = "k1", apply_clamp: bool = True) -> None:
        if kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"Invalid KL estimator: {kl_estimator}. Valid choices: k1, k2, k3")
        self.kl_estimator = kl_estimator
        self.apply_clamp = apply_clamp

    def __call__(self, log_probs: torch.Tensor, log_probs_base: torch.Tensor) -> torch.Tensor:
        return self._compute_approx_kl(
            log_probs, log_probs_base, self.kl_estimator, self.apply_clamp
        )

    @staticmethod
    def _compute_approx_kl(
        log_probs: torch.Tensor,
        log_probs_base: torch.Tensor,
        kl_estimator: str = "k1",
        apply_clamp: bool = True,
    ) -> torch.Tensor:
        kl = kl_estimate(log_probs.float(), log_probs_base.float(), kl_estimator)
        return kl.clamp(min=-10, max=10) if apply_clamp else kl


def _batch_sum(enabled: bool, group: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A sum over ``group``'s processes when asked and a process group is up, else None."""
    dist = torch.distributed
    if not (enabled and dist.is_available() and dist.is_initialized()):
        return None

    def total(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
        return t

    return total


class Normalization:
    """``Normalization(config)(x, loss_mask=None, high_precision=True, reduce_group=None,
    group_sizes=None)``: ``(x - mean) * mask / (std + eps)`` as float32 of ``x``'s shape
    (``[B]`` or ``[B, T]``), the options ``mean_level``, ``mean_leave1out``, ``std_level``,
    ``std_unbiased``, ``group_size`` and ``eps`` read from ``config`` (see the module doc)."""

    def __init__(self, config: Any) -> None:
        self.mean_level = config.mean_level
        self.mean_leave1out = config.mean_leave1out
        self.std_level = config.std_level
        self.std_unbiased = config.std_unbiased
        self.group_size = config.group_size
        self.eps = config.eps

    def _groups(self, bs: int, group_sizes: list[int] | None) -> int | list[int]:
        """Rows per group, or the group sizes (positive, summing to ``bs``)."""
        if group_sizes is None:
            if bs % self.group_size:
                raise ValueError(
                    f"batch size {bs} is not divisible by group_size {self.group_size}"
                )
            return self.group_size
        if any(sz <= 0 for sz in group_sizes):
            raise ValueError(f"group_sizes must be all positive, got {group_sizes}")
        if sum(group_sizes) != bs:
            raise ValueError(
                f"group_sizes sum ({sum(group_sizes)}) must equal batch size ({bs}), "
                f"got {group_sizes}"
            )
        return list(group_sizes)

    @torch.no_grad()
    def __call__(
        self,
        x: torch.Tensor,
        loss_mask: torch.Tensor | None = None,
        high_precision: bool = True,
        reduce_group: Any = None,
        group_sizes: list[int] | None = None,
    ) -> torch.Tensor:
        if loss_mask is not None and loss_mask.sum().item() == 0:
            return x.float()
        bs = x.shape[0]
        groups: int | list[int] = bs
        if "group" in (self.mean_level, self.std_level):
            groups = self._groups(bs, group_sizes)
        rows = x.reshape(bs, -1).to(torch.float64 if high_precision else torch.float32)
        mask = torch.ones_like(rows, dtype=torch.bool)
        if loss_mask is not None:
            mask = loss_mask.reshape(rows.shape).bool()
        rows = torch.where(mask, rows, 0.0)
        loo = self.mean_leave1out and self.mean_level is not None
        alone = self._one_row_groups(bs, groups, x.device)

        def own_row_mean(mean: torch.Tensor) -> torch.Tensor:
            # AReaL: a one-row group's leave-one-out mean is the row itself
            return torch.where(alone, rows, mean) if loo and self.mean_level == "group" else mean

        mean, std = normalization_stats(
            rows, mask, self.mean_level, self.std_level, groups, loo, self.std_unbiased,
            _batch_sum(True, reduce_group), degenerate_std=1.0, adjust_mean=own_row_mean,
        )  # fmt: skip
        if std is not None and self.std_unbiased and self.std_level == "group":
            std = torch.where(alone, 1.0, std)
        out = torch.where(mask, rows if mean is None else rows - mean, 0.0)
        if std is not None:
            out = out / (std + self.eps)
        return out.float().reshape(x.shape)

    @staticmethod
    def _one_row_groups(bs: int, groups: int | list[int], device: Any) -> torch.Tensor:
        """bool ``[B, 1]``: the rows that are a group of their own."""
        sizes = [groups] * (bs // groups) if isinstance(groups, int) else groups
        counts = torch.tensor(sizes, device=device)
        return (counts == 1).repeat_interleave(counts).unsqueeze(1)


@torch.no_grad()
def masked_normalization(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    dim: Any = None,
    unbiased: bool = False,
    eps: float = 1e-5,
    high_precision: bool = True,
    all_reduce: bool = True,
    reduce_group: Any = None,
) -> torch.Tensor:
    """``x`` normalised by the mean and std of its masked elements over ``dim`` (see the
    module doc), float32 of ``x``'s shape."""
    x = x.to(torch.float64 if high_precision else torch.float32)
    m = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.bool().expand_as(x)
    dims = sorted(range(x.ndim) if dim is None else {d % x.ndim for d in _as_tuple(dim)})
    kept = [d for d in range(x.ndim) if d not in dims]
    perm = kept + dims
    n_rows = math.prod(x.shape[d] for d in kept)
    rows = torch.where(m, x, 0.0).permute(perm).reshape(n_rows, -1)
    mrows = m.permute(perm).reshape(n_rows, -1)
    level = "group" if kept else "batch"
    batch_sum = _batch_sum(all_reduce and not kept, reduce_group)
    mean, std = normalization_stats(rows, mrows, level, level, 1, False, unbiased, batch_sum)
    assert mean is not None and std is not None
    out = (rows - mean) / (std + eps)
    shape = [x.shape[d] for d in perm]
    return out.reshape(shape).permute(_inverse(perm)).float()


def _as_tuple(dim: Any) -> tuple[int, ...]:
    return tuple(dim) if isinstance(dim, (tuple, list)) else (int(dim),)


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv
