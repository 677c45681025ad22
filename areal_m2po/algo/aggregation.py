"""Loss aggregation: how per-token losses become one loss, and what a micro-batch weighs.

Owns :func:`agg_loss` (numerator over the kept tokens, denominators from the valid tokens
BEFORE M2PO / rejection masking, so a masked token removes its own gradient without inflating
the others'; the M2PO paper's objective, while AReaL divides by the kept count inside a
micro-batch), its denominator count :func:`agg_loss_weight`, and :func:`check_loss_inputs`,
the argument checks every loss of this package runs first.

Conventions: per-token tensors are padded 2-D ``[B, T]`` (``B`` sequences, ``T`` positions)
unless a docstring says otherwise; ``loss_mask`` is a ``torch.bool`` ``[B, T]`` tensor, True on
generated tokens that count ("valid" tokens); log-probs are in nats, aligned to their token, and
arbitrary at masked positions (never read unmasked).

The module imports only torch, :mod:`areal_m2po.algo.options` and
:mod:`areal_m2po.algo.checks`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.checks import check_bool_mask, check_choice, check_same_shape, check_tensor
from areal_m2po.algo.options import LOSS_AGG_MODES

__all__ = ["agg_loss", "agg_loss_weight", "check_loss_inputs"]


def agg_loss_weight(loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """The denominator count of :func:`agg_loss` for a (micro-)batch: what the batch weighs.

    * "token-mean": the number of valid tokens;
    * "seq-mean-token-mean", "seq-mean-token-sum-norm": the number of rows with at least one
      valid token (a row without any is no sample of the loss).

    ``agg_loss`` divides by exactly this count (at least 1), so for any split of a batch into
    blocks of rows, ``sum_blocks agg_loss(block) * weight(block) / weight(batch)`` equals
    ``agg_loss(batch)``: the gradient does not depend on the micro-batch split, nor on leaving
    out rows whose token losses are all zero (e.g. zero advantages) once ``weight(batch)`` was
    counted with them.

    Args:
        loss_mask: bool ``[B, T]`` (``[N]`` allowed for "token-mean").
    Returns:
        int64 0-dim tensor.
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = check_bool_mask("loss_mask", loss_mask)
    if loss_agg_mode == "token-mean":
        return mask.sum()
    if mask.ndim != 2:
        raise ValueError(
            f"loss_agg_mode {loss_agg_mode!r} needs a [B, T] loss_mask, got {tuple(mask.shape)}"
        )
    return mask.any(dim=1).sum()


def agg_loss(
    token_loss: torch.Tensor,
    keep_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    max_tokens_norm: int | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses: numerator over ``keep_mask``, denominators from ``loss_mask``.

    With ``W = agg_loss_weight(loss_mask, loss_agg_mode)`` (clamped to >= 1):

    * "token-mean": ``sum_kept / W``, W the number of valid tokens.
    * "seq-mean-token-mean": per row ``sum_kept_row / n_valid_row``, summed over the rows and
      divided by W, the number of rows with at least one valid token.
    * "seq-mean-token-sum-norm" (Dr. GRPO): ``sum_kept / (W * max_tokens_norm)``, W the number
      of rows with at least one valid token, ``max_tokens_norm`` defaulting to ``T``.

    Args:
        token_loss: float ``[B, T]`` (``[N]`` allowed for "token-mean"); values outside
            ``keep_mask`` are ignored (NaN-safe).
        keep_mask, loss_mask: bool, same shape; ``keep_mask`` should be a subset of ``loss_mask``.
    Returns:
        0-dim loss tensor (differentiable through ``token_loss``).
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    tl = torch.where(
        keep_mask, token_loss, torch.zeros((), dtype=token_loss.dtype, device=token_loss.device)
    )
    if loss_agg_mode != "token-mean" and token_loss.ndim != 2:
        raise ValueError(
            f"loss_agg_mode {loss_agg_mode!r} needs [B, T] tensors, got {tuple(token_loss.shape)}"
        )
    weight = agg_loss_weight(loss_mask, loss_agg_mode).clamp(min=1).to(tl.dtype)
    if loss_agg_mode == "token-mean":
        return tl.sum() / weight
    if loss_agg_mode == "seq-mean-token-mean":
        n_row = loss_mask.sum(dim=1)
        return (tl.sum(dim=1) / n_row.clamp(min=1).to(tl.dtype)).sum() / weight
    norm = token_loss.shape[1] if max_tokens_norm is None else max_tokens_norm
    if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not norm > 0:
        raise ValueError(f"max_tokens_norm must be a positive number, got {max_tokens_norm!r}")
    return tl.sum() / (weight * float(norm))


def check_loss_inputs(
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None,
    loss_agg_mode: str,
    **tensors: torch.Tensor,
) -> None:
    """One-line TypeError / ValueError unless ``loss_mask`` (and ``m2po_mask``) are bool, every
    tensor in ``tensors`` (named by its keyword) is float, all have ``loss_mask``'s shape and
    ``loss_agg_mode`` is one of ``LOSS_AGG_MODES``."""
    check_bool_mask("loss_mask", loss_mask)
    for name, t in tensors.items():
        check_tensor(name, t, floating=True)
    if m2po_mask is not None:
        check_bool_mask("m2po_mask", m2po_mask)
    check_same_shape("loss_mask", loss_mask, **tensors, m2po_mask=m2po_mask)
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
