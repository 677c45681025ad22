"""Where the tokens of AReaL's two layouts sit in the ``[rows, width]`` grid this package's
maths takes: a padded ``[B, T]`` tensor as it is, a 1-D packed ``[N]`` one (sequences one after
the other, boundaries in int ``cu_seqlens`` ``[B + 1]``) scattered into right-padded rows, and
back. The loss adapters and :func:`apply_rejection_sampling` of this package use it; it imports
torch only and keeps no state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Layout", "layout"]


@dataclass(frozen=True)
class Layout:
    """Where each of the caller's tokens sits in the ``[rows, width]`` grid the maths takes:
    ``index`` (row, column) per packed token, or None when the caller's tensor is already
    ``[B, T]`` or is a 1-D single sequence."""

    shape: torch.Size
    index: tuple[torch.Tensor, torch.Tensor] | None
    rows: int
    width: int

    def to_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The caller's tensor as rows (packed: padding cells 0 / False; differentiable)."""
        if self.index is None:
            return x if x.ndim == 2 else x.reshape(1, -1)
        out = torch.zeros((self.rows, self.width), dtype=x.dtype, device=x.device)
        return out.index_put(self.index, x)

    def to_caller(self, y: torch.Tensor) -> torch.Tensor:
        """Rows back in the caller's layout (packed: the padding cells dropped)."""
        if self.index is None:
            return y.reshape(self.shape)
        return y[self.index]


def layout(x: torch.Tensor, cu_seqlens: torch.Tensor | None, missing: str | None) -> Layout:
    """The layout of ``x``: 2-D as it is; 1-D packed by ``cu_seqlens``, or (None) one
    sequence, unless ``missing`` is the message refusing that.

    Raises:
        ValueError: ``x`` is not 1-D or 2-D; ``cu_seqlens`` is not a valid boundary list of
            ``x``; ``missing`` is set and ``cu_seqlens`` is None for a 1-D ``x``.
    """
    if x.ndim not in (1, 2):
        raise ValueError(f"Expected 1D (packed) or 2D (padded) tensors, got ndim={x.ndim}")
    if x.ndim == 2 or (cu_seqlens is None and missing is None):
        rows, width = (x.shape[0], x.shape[1]) if x.ndim == 2 else (1, x.shape[0])
        return Layout(x.shape, None, rows, width)
    if cu_seqlens is None:
        raise ValueError(missing)
    cu = cu_seqlens
    if (
        not isinstance(cu, torch.Tensor)
        or cu.ndim != 1
        or cu.numel() < 2
        or cu.is_floating_point()
        or int(cu[0]) != 0
        or int(cu[-1]) != x.shape[0]
        or bool((cu[1:] < cu[:-1]).any())
    ):
        raise ValueError(
            "cu_seqlens must be a 1-D integer tensor of sequence boundaries from 0 to the "
            f"{x.shape[0]} packed tokens, non-decreasing, got {cu!r}"
        )
    cu = cu.to(device=x.device, dtype=torch.long)
    lengths = cu[1:] - cu[:-1]
    row = torch.repeat_interleave(torch.arange(lengths.numel(), device=x.device), lengths)
    col = torch.arange(x.shape[0], device=x.device) - cu[row]
    width = max(int(lengths.max()), 1)
    return Layout(x.shape, (row, col), int(lengths.numel()), width)
