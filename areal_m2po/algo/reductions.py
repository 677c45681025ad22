"""Masked reductions and the dtype/statistics helpers shared by the pure tensor-maths modules.

Conventions: per-token tensors are padded 2-D ``[B, T]`` (``B`` sequences, ``T`` positions)
unless a docstring says otherwise; ``loss_mask`` is a ``torch.bool`` ``[B, T]`` tensor, True on
generated tokens that count ("valid" tokens); log-probs are in nats, aligned to their token, and
arbitrary at masked positions (never read unmasked).

The module imports only torch, keeps no state and has no import-time side effects.
"""

from __future__ import annotations

import torch

__all__ = ["compute_dtype", "masked_mean", "masked_sum", "masked_var", "stat_scalar"]


def compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 are upcast)."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def stat_scalar(x: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """Detached 0-dim float32 tensor (the statistics convention of the loss functions)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float32).reshape(())
    return torch.tensor(float(x), dtype=torch.float32, device=device)


def _as_bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Sum of ``x`` over positions where ``mask`` is True.

    Args:
        x: float tensor, any shape.
        mask: bool (or 0/1 numeric) tensor broadcastable to ``x``.
        dim: reduce over these dims; None reduces everything to a 0-dim tensor.
    Returns:
        Tensor of ``x``'s dtype. Masked-out positions contribute exactly 0, even if NaN.
    """
    xm = torch.where(_as_bool(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return xm.sum() if dim is None else xm.sum(dim=dim)


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None
) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (0 where nothing is selected).

    Shapes as :func:`masked_sum`; the count is ``mask.sum(dim)`` clamped to >= 1.
    """
    m = _as_bool(mask)
    total = masked_sum(x, m, dim)
    m = torch.broadcast_to(m, x.shape)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all positions where ``mask`` is True (0-dim).

    Two-pass (centred) computation. ``unbiased`` divides by ``n - 1``; when ``n - 1 <= 0``
    (resp. ``n == 0``) the result is 0 instead of NaN.
    """
    m = torch.broadcast_to(_as_bool(mask), x.shape)
    n = m.sum()
    mean = masked_mean(x, m)
    ss = masked_sum((x - mean) ** 2, m)
    denom = (n - 1) if unbiased else n
    return torch.where(denom > 0, ss / denom.clamp(min=1).to(ss.dtype), torch.zeros_like(ss))
