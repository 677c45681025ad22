"""Argument checks shared by the pure tensor-maths modules.

Each check raises a one-line ``TypeError`` or ``ValueError`` naming the culprit argument and
returns the (unchanged) value, so it can be used inline. The module imports only torch and
the standard library.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "check_bool_mask",
    "check_choice",
    "check_real",
    "check_same_shape",
    "check_tensor",
]


def check_tensor(name: str, x: Any, *, floating: bool = False) -> torch.Tensor:
    """``x`` must be a tensor (a floating-point one when ``floating``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if floating and not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    return x


def check_bool_mask(name: str, mask: Any) -> torch.Tensor:
    """``mask`` must be a ``torch.bool`` tensor."""
    check_tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must be torch.bool, got {mask.dtype}")
    return mask


def check_same_shape(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Every tensor in ``others`` (None skipped) must have ``ref``'s shape."""
    for name, x in others.items():
        if x is not None and tuple(x.shape) != tuple(ref.shape):
            raise ValueError(
                f"{name} shape {tuple(x.shape)} does not match {ref_name} shape {tuple(ref.shape)}"
            )


def check_real(name: str, value: Any) -> float:
    """``value`` must be a real number (a Python int/float or a one-element tensor)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.item())
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
