"""AReaL's ``Normalization`` (areal-project/AReaL cbff54d6, ``areal/utils/data.py``) with its
arguments and results: rewards or advantages centred and scaled by the batch's or each group's
statistics, each of mean and std chosen on its own.

``Normalization(config)`` reads ``mean_level``, ``mean_leave1out``, ``std_level``,
``std_unbiased``, ``group_size`` and ``eps`` from ``config`` (AReaL's ``NormConfig`` or this
package's). ``norm(x, loss_mask=None, high_precision=True, reduce_group=None,
group_sizes=None)`` returns float32 ``(x - mean) * mask / (std + eps)`` of ``x``'s shape
(``[B]`` or ``[B, T]``), statistics over the mask's elements:

* mean: "batch" (all-reduced over the process group when one is initialised), "group"
  (consecutive groups of ``group_size`` rows, or of ``group_sizes[i]`` rows), or none (0).
  With ``mean_leave1out`` each masked element's mean leaves it out (``(sum - x) / (n - 1)``;
  unmasked elements get the plain mean; 0 when ``n <= 1``; a one-row group gets itself);
* std: "batch" or "group" about that mean, ``sqrt(sum((x - mean)^2 * mask) / n)`` (``n - 1``
  with ``std_unbiased``: 1 when ``n <= 1``, and for a one-row group), 1 when ``n`` is 0; no
  std level: divide by 1 with no ``eps``.
* An all-masked input comes back unchanged (as float32).

Imports torch only; keeps no state beyond the options.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Normalization"]


def _all_reduce(tensors: tuple[torch.Tensor, ...], group: Any) -> None:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)


def _count_and_values(x: torch.Tensor, mask: torch.Tensor | None) -> tuple[Any, Any, Any]:
    """(element count, masked x, mask as x's dtype or None), counts summed over all dims."""
    if mask is None:
        return torch.tensor(float(x.numel()), dtype=x.dtype, device=x.device), x, None
    m = mask.to(x.dtype)
    return m.sum(), x * m, m


class Normalization:
    """See the module docstring."""

    def __init__(self, config: Any) -> None:
        self.mean_level = config.mean_level
        self.mean_leave1out = config.mean_leave1out
        self.std_level = config.std_level
        self.std_unbiased = config.std_unbiased
        self.group_size = config.group_size
        self.eps = config.eps

    def _build_group_slices(self, bs: int, group_sizes: list[int] | None) -> list[slice]:
        """Row slices of the groups: ``group_sizes`` (positive, summing to ``bs``) or fixed
        ``group_size`` blocks."""
        if group_sizes is None:
            size = self.group_size
            return [slice(i * size, (i + 1) * size) for i in range(bs // size)]
        if any(sz <= 0 for sz in group_sizes):
            raise ValueError(f"group_sizes must be all positive, got {group_sizes}")
        if sum(group_sizes) != bs:
            raise ValueError(
                f"group_sizes sum ({sum(group_sizes)}) must equal batch size ({bs}), "
                f"got {group_sizes}"
            )
        starts = [sum(group_sizes[:i]) for i in range(len(group_sizes))]
        return [slice(s, s + sz) for s, sz in zip(starts, group_sizes)]

    @staticmethod
    def _compute_mean(
        x: torch.Tensor,
        mask: torch.Tensor | None,
        high_precision: bool,
        leave_one_out: bool,
        all_reduce: bool,
        reduce_group: Any,
    ) -> torch.Tensor:
        """The mean (keepdim over every dim, or per element with ``leave_one_out``)."""
        x = x.to(torch.float64 if high_precision else torch.float32)
        count, xm, m = _count_and_values(x, mask)
        total = xm.sum().reshape([1] * x.ndim)
        count = count.reshape([1] * x.ndim)
        if all_reduce:
            _all_reduce((count, total), reduce_group)
        if leave_one_out:
            if count.item() <= 1:
                return torch.zeros_like(total)
            if m is None:
                return (total - x) / (count - 1)
            loo = (total - xm) / torch.clamp(count - m, min=1.0)
            return torch.where(m > 0, loo, (total / count).expand_as(x))
        if count.item() == 0:
            return torch.zeros_like(total)
        return total / count

    @staticmethod
    def _compute_std(
        x: torch.Tensor,
        mask: torch.Tensor | None,
        mean: torch.Tensor,
        unbiased: bool,
        high_precision: bool,
        all_reduce: bool,
        reduce_group: Any,
    ) -> torch.Tensor:
        """The std about ``mean`` (keepdim over every dim)."""
        dtype = torch.float64 if high_precision else torch.float32
        x, mean = x.to(dtype), mean.to(dtype)
        count, xm, m = _count_and_values(x, mask)
        centred = xm - mean if m is None else xm - mean * m
        sq = (centred * centred).sum().reshape([1] * x.ndim)
        count = count.reshape([1] * x.ndim)
        if all_reduce:
            _all_reduce((count, sq), reduce_group)
        if unbiased:
            return torch.ones_like(sq) if count.item() <= 1 else (sq / (count - 1)).sqrt()
        return torch.ones_like(sq) if count.item() == 0 else (sq / count).sqrt()

    def _group_stat(self, x, mask, slices, stat) -> torch.Tensor:
        out = torch.zeros_like(x)
        for s in slices:
            out[s] = stat(x[s], mask[s] if mask is not None else None, s).expand_as(x[s])
        return out

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
        slices = None
        if "group" in (self.mean_level, self.std_level):
            slices = self._build_group_slices(x.size(0), group_sizes)
        dtype = torch.float64 if high_precision else torch.float32
        loo = self.mean_leave1out

        def group_mean(xx, m, s):
            if s.stop - s.start == 1 and loo:
                return xx.to(dtype)
            return self._compute_mean(xx, m, high_precision, loo, False, None)

        if self.mean_level == "batch":
            mean = self._compute_mean(x, loss_mask, high_precision, loo, True, reduce_group)
            mean = mean.expand_as(x)
        elif self.mean_level == "group":
            mean = self._group_stat(x, loss_mask, slices, group_mean)
        else:
            mean = torch.zeros_like(x)
        centred = x - mean
        if loss_mask is not None:
            centred = centred * loss_mask
        eps = self.eps
        unbiased = self.std_unbiased

        def group_std(xx, m, s):
            if s.stop - s.start == 1 and unbiased:
                return torch.ones((1, *xx.shape[1:]), dtype=dtype, device=xx.device)
            return self._compute_std(xx, m, mean[s], unbiased, high_precision, False, None)

        if self.std_level == "batch":
            std = self._compute_std(
                x, loss_mask, mean, unbiased, high_precision, True, reduce_group
            ).expand_as(x)
        elif self.std_level == "group":
            std = self._group_stat(x, loss_mask, slices, group_std)
        else:
            std, eps = torch.ones_like(x), 0.0
        return (centred / (std + eps)).float()
