"""Chunked per-token label log-probs and entropy from logits, with a memory-light backward.

The module imports only torch, the standard library and ``areal_m2po.algo.checks``, keeps no
state and has no import-time side effects.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from areal_m2po.algo.checks import check_real as _check_real
from areal_m2po.algo.checks import check_tensor as _check_tensor

__all__ = ["gather_logprobs_entropy"]


def _row_chunks(shape: tuple[int, int], chunk_size: int) -> list[tuple[slice, slice]]:
    """(batch slice, time slice) blocks of about ``chunk_size`` rows of a [B, T] grid."""
    nb, nt = shape
    if nt >= chunk_size:
        return [
            (slice(b, b + 1), slice(t0, min(t0 + chunk_size, nt)))
            for b in range(nb)
            for t0 in range(0, nt, chunk_size)
        ]
    per = max(1, chunk_size // max(nt, 1))
    return [(slice(b0, min(b0 + per, nb)), slice(0, nt)) for b0 in range(0, nb, per)]


class _ChunkedLabelLogProb(torch.autograd.Function):
    """log softmax(logits / T)[label] over a [B, T, V] view, in blocks of about
    ``chunk_size`` rows; saves only the logits (no copy), the labels and the logsumexp."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        chunk_size: int,
        compute_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        nb, nt, _ = logits.shape
        cdtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        dev = logits.device
        out = torch.empty(nb, nt, dtype=cdtype, device=dev)
        lse_all = torch.empty(nb, nt, dtype=cdtype, device=dev)
        ent = torch.empty((nb, nt) if compute_entropy else (0, 0), dtype=cdtype, device=dev)
        for bs, ts in _row_chunks((nb, nt), chunk_size):
            x = logits[bs, ts].to(cdtype)
            if temperature != 1.0:
                x = x / temperature
            lse = torch.logsumexp(x, dim=-1)
            lse_all[bs, ts] = lse
            out[bs, ts] = x.gather(-1, labels[bs, ts].unsqueeze(-1)).squeeze(-1) - lse
            if compute_entropy:
                p = torch.exp(x - lse.unsqueeze(-1))
                ent[bs, ts] = lse - (p * x).sum(dim=-1)
        ctx.save_for_backward(logits, labels, lse_all)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_out: torch.Tensor, _grad_ent: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        logits, labels, lse_all = ctx.saved_tensors
        temperature: float = ctx.temperature
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        cdtype = lse_all.dtype
        for bs, ts in _row_chunks(tuple(logits.shape[:2]), ctx.chunk_size):
            x = logits[bs, ts].to(cdtype)
            if temperature != 1.0:
                x = x / temperature
            g = grad_out[bs, ts].to(cdtype).unsqueeze(-1)
            gx = torch.exp(x - lse_all[bs, ts].unsqueeze(-1)).mul_(-g)
            gx.scatter_add_(-1, labels[bs, ts].unsqueeze(-1), g)
            if temperature != 1.0:
                gx.div_(temperature)
            grad[bs, ts] = gx.to(grad.dtype)
        return grad, None, None, None, None


def gather_logprobs_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    compute_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token ``log softmax(logits / temperature)[label]`` and entropy, chunked over rows.

    Blocks of about ``chunk_size`` rows (tokens) are upcast to fp32 (fp64 for fp64 logits)
    one at a time, and only ``logsumexp`` and the label's logit are kept, so no full-size fp32
    ``[..., V]`` log-softmax is materialised in forward; autograd keeps only the original
    logits (a strided view such as ``out.logits[:, :-1]`` is used as is, not copied) and the
    backward pass recomputes the softmax block by block. The log-probs are differentiable
    w.r.t. ``logits``; the entropy is a no-grad statistic.

    Args:
        logits: ``[B, T, V]`` or ``[N, V]`` float (any float dtype).
        labels: ``[B, T]`` or ``[N]`` integer token ids in ``[0, V)``.
        temperature: softmax temperature (> 0), the same one used at generation.
        chunk_size: rows per block (> 0).
        compute_entropy: also return the per-token entropy (nats).
    Returns:
        ``(logprobs, entropy)`` shaped like ``labels``, fp32 (fp64 for fp64 logits);
        ``entropy`` is None when ``compute_entropy`` is False.
    """
    _check_tensor("logits", logits, floating=True)
    _check_tensor("labels", labels)
    if logits.ndim < 2 or tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape {tuple(logits.shape)} "
            "without its last (vocabulary) dimension"
        )
    if labels.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"labels must be an integer tensor, got {labels.dtype}")
    t = _check_real("temperature", temperature)
    if not t > 0 or math.isinf(t):
        raise ValueError(f"temperature must be a positive finite number, got {t}")
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    vocab = logits.shape[-1]
    if logits.ndim == 2:
        logits3 = logits.unsqueeze(0)
    elif logits.ndim == 3:
        logits3 = logits
    else:
        logits3 = logits.reshape(-1, logits.shape[-2], vocab)
    labels3 = labels.reshape(logits3.shape[:2]).to(torch.int64)
    lp, ent = _ChunkedLabelLogProb.apply(logits3, labels3, t, chunk_size, bool(compute_entropy))
    lp = lp.view(labels.shape)
    if not compute_entropy:
        return lp, None
    return lp, ent.view(labels.shape)
