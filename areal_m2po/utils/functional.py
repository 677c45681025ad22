"""Pure tensor maths for the PPO actor/critic: PPO/SAPO/critic losses, advantage and reward
helpers, chunked log-prob gathering. The M2PO mask lives in :mod:`areal_m2po.utils.m2po`
(its names are re-exported here).

Conventions (every function in this module follows them):

* Per-token tensors are padded 2-D ``[B, T]`` (``B`` sequences, ``T`` positions) unless a
  docstring says otherwise.
* ``loss_mask`` is a ``torch.bool`` ``[B, T]`` tensor, True on generated (completion) tokens
  that count in the loss ("valid" tokens).
* ``logprobs[b, t]`` is ``log p(token_t | tokens_<t)`` in nats, already aligned to the token;
  values at masked positions are arbitrary (they are never read unmasked, and never leak NaN
  into values or gradients).
* Losses return ``(loss, stats)``: ``loss`` is a 0-dim tensor; ``stats`` maps names to
  detached 0-dim float32 tensors, each a MEAN over the micro-batch's valid tokens
  (``loss_mask``) unless the name says otherwise (``*_max``, ``*_min``, ``m2po/n_*``,
  ``m2po/threshold``), so callers can average them weighted by valid-token counts.
* Loss denominators count the valid tokens of ``loss_mask`` BEFORE M2PO / rejection masking:
  a masked token removes its own gradient without inflating the others' (M2PO paper's
  objective; AReaL instead divides by the kept count inside a micro-batch).

The module imports only torch, the standard library and the other pure-maths modules of
``areal_m2po.utils`` (``checks``, ``m2po``), keeps no global state and has no import-time side
effects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from areal_m2po.utils.checks import check_bool_mask as _check_bool_mask
from areal_m2po.utils.checks import check_choice as _check_choice
from areal_m2po.utils.checks import check_real as _check_real
from areal_m2po.utils.checks import check_same_shape as _check_same_shape
from areal_m2po.utils.checks import check_tensor as _check_tensor

# M2PO lives in areal_m2po.utils.m2po; re-exported here for code written against this module
from areal_m2po.utils.m2po import (
    apply_m2po_masking,
    m2_per_token,
    m2po_keep_mask,
    m2po_stats,
)

__all__ = [
    "LOSS_AGG_MODES",
    "agg_loss",
    "agg_loss_weight",
    "apply_m2po_masking",
    "gae_advantages",
    "gather_logprobs_entropy",
    "group_normalize",
    "kl_estimate",
    "m2_per_token",
    "m2po_keep_mask",
    "m2po_stats",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "masked_var",
    "overlong_reward_penalty",
    "ppo_actor_loss_fn",
    "ppo_critic_loss_fn",
    "reward_transform",
    "sapo_loss_fn",
]

LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
_KL_ESTIMATORS = ("k1", "k2", "k3")
_NORM_LEVELS = ("batch", "group", None)
_IS_LEVELS = ("token", "sequence")

# --------------------------------------------------------------------------------------
# Small helpers (argument checks: areal_m2po.utils.checks)
# --------------------------------------------------------------------------------------


def _compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32 (bf16/fp16 are upcast)."""
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _scalar(x: torch.Tensor | float, device: torch.device) -> torch.Tensor:
    """Detached 0-dim float32 tensor (the stats convention)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to(torch.float32).reshape(())
    return torch.tensor(float(x), dtype=torch.float32, device=device)


# --------------------------------------------------------------------------------------
# Masked reductions
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# KL estimators, reward shaping, normalisation
# --------------------------------------------------------------------------------------


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: str = "k1",
    clamp: float | None = None,
) -> torch.Tensor:
    """Per-token KL estimators (Schulman's k1/k2/k3) of KL(p || ref) from samples of p.

    With ``d = logprobs - ref_logprobs`` (nats): k1 = d; k2 = d^2 / 2;
    k3 = exp(-d) - 1 + d (= exp(ref - logp) - 1 - (ref - logp), always >= 0).

    Args:
        logprobs, ref_logprobs: float ``[B, T]`` (any equal shapes).
        estimator: "k1" | "k2" | "k3".
        clamp: if set (> 0), each estimate is clamped to ``[-clamp, clamp]`` (AReaL's KL
            reward uses 10).
    Returns:
        ``[B, T]`` tensor of the promoted float dtype.
    """
    _check_tensor("logprobs", logprobs, floating=True)
    _check_tensor("ref_logprobs", ref_logprobs, floating=True)
    _check_same_shape("logprobs", logprobs, ref_logprobs=ref_logprobs)
    _check_choice("estimator", estimator, _KL_ESTIMATORS)
    bound = None
    if clamp is not None:
        bound = _check_real("clamp", clamp)
        if not bound > 0:
            raise ValueError(f"clamp must be > 0, got {bound}")
    d = logprobs - ref_logprobs
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d * d
    else:
        kl = torch.expm1(-d) + d
    return kl if bound is None else kl.clamp(min=-bound, max=bound)


def reward_transform(
    rewards: torch.Tensor,
    scaling: float = 1.0,
    bias: float = 0.0,
    clip: float | None = None,
) -> torch.Tensor:
    """AReaL's reward shaping: ``clamp((rewards + bias) * scaling, -clip, clip)``.

    Args:
        rewards: float ``[B]`` sequence rewards.
        scaling, bias: affine transform (bias is added BEFORE scaling, as in AReaL).
        clip: symmetric clip bound (> 0); None disables clipping.
    Returns:
        float ``[B]`` (new tensor).
    """
    _check_tensor("rewards", rewards, floating=True)
    out = (rewards + _check_real("bias", bias)) * _check_real("scaling", scaling)
    if clip is not None:
        c = _check_real("clip", clip)
        if not c > 0:
            raise ValueError(f"clip must be > 0, got {c}")
        out = out.clamp(min=-c, max=c)
    return out


def overlong_reward_penalty(
    rewards: torch.Tensor,
    completion_lengths: torch.Tensor,
    overlong_tokens: int,
    overlong_penalty_factor: float,
    max_new_tokens: int,
) -> torch.Tensor:
    """DAPO soft overlong punishment.

    With ``expected = max_new_tokens - overlong_tokens`` and
    ``exceed = length - expected``, the penalty is
    ``min(-exceed / overlong_tokens * overlong_penalty_factor, 0)``: zero up to ``expected``
    tokens, then linear down to ``-overlong_penalty_factor`` at ``max_new_tokens``.

    Args:
        rewards: float ``[B]``.
        completion_lengths: ``[B]`` number of generated tokens per sequence (int or float).
        overlong_tokens: length of the soft-punishment zone (0 < overlong_tokens <= max_new_tokens).
        overlong_penalty_factor: maximal penalty (>= 0).
        max_new_tokens: generation budget.
    Returns:
        float ``[B]`` = rewards + penalty (new tensor).
    """
    _check_tensor("rewards", rewards, floating=True)
    _check_tensor("completion_lengths", completion_lengths)
    _check_same_shape("rewards", rewards, completion_lengths=completion_lengths)
    if not isinstance(overlong_tokens, int) or isinstance(overlong_tokens, bool):
        raise TypeError(f"overlong_tokens must be an int, got {type(overlong_tokens).__name__}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if not 0 < overlong_tokens <= max_new_tokens:
        raise ValueError(
            f"overlong_tokens must be in (0, max_new_tokens={max_new_tokens}], got {overlong_tokens}"
        )
    factor = _check_real("overlong_penalty_factor", overlong_penalty_factor)
    if factor < 0:
        raise ValueError(f"overlong_penalty_factor must be >= 0, got {factor}")
    expected = max_new_tokens - overlong_tokens
    exceed = completion_lengths.to(rewards.dtype) - expected
    penalty = (-exceed / overlong_tokens * factor).clamp(max=0.0)
    return rewards + penalty


def _check_norm_args(
    mean_level: str | None,
    std_level: str | None,
    group_size: int | None,
    batch: int,
    mean_leave1out: bool,
) -> int | None:
    _check_choice("mean_level", mean_level, _NORM_LEVELS)
    _check_choice("std_level", std_level, _NORM_LEVELS)
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
    _check_tensor("x", x, floating=True)
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
    _check_tensor("x", x, floating=True)
    _check_bool_mask("mask", mask)
    _check_same_shape("x", x, mask=mask)
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


# --------------------------------------------------------------------------------------
# GAE
# --------------------------------------------------------------------------------------


@torch.no_grad()
def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    loss_mask: torch.Tensor,
    discount: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each sequence's valid tokens, in order.

    For the valid positions ``t_1 < ... < t_n`` of a row:
    ``delta_k = r[t_k] + discount * V[t_{k+1}] - V[t_k]`` (``V[t_{n+1}] = 0``),
    ``A_k = delta_k + discount * gae_lambda * A_{k+1}``, ``returns = A + V``.
    Rewards/values at invalid positions are ignored (gaps inside a row are skipped).

    Args:
        token_rewards, values: float ``[B, T]``; loss_mask: bool ``[B, T]``.
    Returns:
        ``(advantages, returns)`` float ``[B, T]``, 0 outside ``loss_mask``; not differentiable.
    """
    _check_tensor("token_rewards", token_rewards, floating=True)
    _check_tensor("values", values, floating=True)
    _check_bool_mask("loss_mask", loss_mask)
    _check_same_shape("loss_mask", loss_mask, token_rewards=token_rewards, values=values)
    if loss_mask.ndim != 2:
        raise ValueError(f"loss_mask must be 2-D [B, T], got shape {tuple(loss_mask.shape)}")
    gamma = _check_real("discount", discount)
    lam = _check_real("gae_lambda", gae_lambda)
    dtype = _compute_dtype(token_rewards, values)
    r = torch.where(loss_mask, token_rewards.to(dtype), 0.0)
    v = torch.where(loss_mask, values.to(dtype), 0.0)
    adv = torch.zeros_like(r)
    B, T = loss_mask.shape
    cols = loss_mask.any(dim=0).nonzero()
    if B == 0 or cols.numel() == 0:
        return adv, torch.zeros_like(r)
    t_lo, t_hi = int(cols[0]), int(cols[-1])
    next_v = torch.zeros(B, dtype=dtype, device=r.device)
    last = torch.zeros(B, dtype=dtype, device=r.device)
    for t in range(t_hi, t_lo - 1, -1):
        m = loss_mask[:, t]
        vt = v[:, t]
        g = r[:, t] + gamma * next_v - vt + (gamma * lam) * last
        adv[:, t] = torch.where(m, g, 0.0)
        next_v = torch.where(m, vt, next_v)
        last = torch.where(m, g, last)
    returns = torch.where(loss_mask, adv + v, 0.0)
    return adv, returns


# --------------------------------------------------------------------------------------
# Chunked log-prob / entropy gathering
# --------------------------------------------------------------------------------------


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
    def forward(  # type: ignore[override]
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
    def backward(  # type: ignore[override]
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


# --------------------------------------------------------------------------------------
# Loss aggregation
# --------------------------------------------------------------------------------------


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
    _check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = _check_bool_mask("loss_mask", loss_mask)
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
    _check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
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


# --------------------------------------------------------------------------------------
# Rejection sampling (truncated / masked importance sampling on the behaviour drift)
# --------------------------------------------------------------------------------------


def _rs_get(spec: Any, name: str, default: Any) -> Any:
    if isinstance(spec, Mapping):
        return spec.get(name, default)
    return getattr(spec, name, default)


def _parse_rejection_sampling(spec: Any) -> dict[str, Any] | None:
    if spec is None:
        return None
    cfg = {
        "level": _rs_get(spec, "level", "token"),
        "action": _rs_get(spec, "action", "mask"),
        "metric": _rs_get(spec, "metric", "ratio"),
        "agg": _rs_get(spec, "agg", "mean"),
        "upper": _rs_get(spec, "upper", None),
        "lower": _rs_get(spec, "lower", None),
    }
    _check_choice("rejection_sampling.level", cfg["level"], _IS_LEVELS)
    _check_choice("rejection_sampling.action", cfg["action"], ("mask", "clamp"))
    _check_choice("rejection_sampling.metric", cfg["metric"], ("ratio", "kl_k1", "kl_k2", "kl_k3"))
    _check_choice("rejection_sampling.agg", cfg["agg"], ("mean", "sum", "max"))
    for b in ("upper", "lower"):
        if cfg[b] is not None:
            cfg[b] = _check_real(f"rejection_sampling.{b}", cfg[b])
            if math.isnan(cfg[b]):
                raise ValueError(f"rejection_sampling.{b} must not be NaN")
    if cfg["upper"] is not None and cfg["lower"] is not None and cfg["lower"] > cfg["upper"]:
        raise ValueError(
            f"rejection_sampling.lower ({cfg['lower']}) must be <= upper ({cfg['upper']})"
        )
    if cfg["action"] == "clamp" and cfg["metric"] != "ratio":
        raise ValueError(
            f"rejection_sampling.action='clamp' needs metric='ratio', got {cfg['metric']!r}"
        )
    return cfg


def _in_bounds(metric: torch.Tensor, lower: float | None, upper: float | None) -> torch.Tensor:
    ok = torch.ones_like(metric, dtype=torch.bool)
    if lower is not None:
        ok &= metric >= lower
    if upper is not None:
        ok &= metric <= upper
    return ok


def _apply_rejection_sampling(
    cfg: dict[str, Any],
    log_w: torch.Tensor,
    cand: torch.Tensor,
    prox: torch.Tensor,
    old: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns ``(keep_rs, w, affected)``: bool keep mask, behaviour weight to use, and the
    tokens rejected (mask) or whose weight was clamped (clamp). ``log_w`` is 0 off ``cand``."""
    w = torch.exp(log_w)
    lower, upper = cfg["lower"], cfg["upper"]
    if cfg["metric"] == "ratio":
        metric = w
    else:
        metric = torch.where(cand, kl_estimate(prox, old, cfg["metric"][3:]), 0.0)
    no_bounds = lower is None and upper is None
    if cfg["level"] == "token":
        if cfg["action"] == "mask":
            keep = _in_bounds(metric, lower, upper)
            return keep, w, cand & ~keep
        w_new = w if no_bounds else w.clamp(min=lower, max=upper)
        return torch.ones_like(cand), w_new, cand & (w_new != w)
    # sequence level
    if log_w.ndim != 2:
        raise ValueError("rejection_sampling.level='sequence' needs [B, T] tensors")
    n_row = cand.sum(dim=1, keepdim=True)
    empty = n_row == 0
    if cfg["metric"] == "ratio":
        # aggregate in log space (geometric mean / product / max ratio); the sequence's
        # geometric-mean ratio becomes every token's behaviour weight (AReaL semantics)
        vals = log_w
        w = torch.exp(vals.sum(dim=1, keepdim=True) / n_row.clamp(min=1)).expand_as(log_w)
    else:
        vals = metric
    if cfg["agg"] == "sum":
        seq = vals.sum(dim=1, keepdim=True)
    elif cfg["agg"] == "mean":
        seq = vals.sum(dim=1, keepdim=True) / n_row.clamp(min=1)
    else:
        seq = torch.where(cand, vals, -math.inf).amax(dim=1, keepdim=True)
        seq = torch.where(empty, torch.zeros_like(seq), seq)
    seq_metric = torch.exp(seq) if cfg["metric"] == "ratio" else seq
    ok = _in_bounds(seq_metric, lower, upper) | empty
    if cfg["action"] == "mask":
        keep = ok.expand_as(cand)
        return keep, w, cand & ~keep
    w_new = w if no_bounds else torch.where(ok, w, w.clamp(min=lower, max=upper))
    return torch.ones_like(cand), w_new, cand & (w_new != w)


# --------------------------------------------------------------------------------------
# Policy / value losses
# --------------------------------------------------------------------------------------


def _policy_ratio(
    lp: torch.Tensor,
    ref: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    keep: torch.Tensor,
    level: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy ratio of every token and the advantage it is multiplied with.

    "token": ``r_t = exp(lp_t - ref_t)``, advantages unchanged.

    "sequence" (GSPO, as AReaL computes it): ``r = exp(mean over the row's kept tokens of
    (lp - ref))`` with its full gradient (``d r / d lp_t = r / n_kept``), on every token of the
    row, and each token's advantage replaced by the mean advantage of the row's kept tokens.
    The row's loss is then a function of the sequence ratio alone, so token-level behaviour
    weights ``w_t`` enter the gradient of every token of the row through their mean
    (``d loss / d lp_t`` is proportional to ``A_mean * r * mean_t'(w_t')``).

    Args:
        lp: ``[B, T]`` current log-probs (differentiable); ref: ``[B, T]`` (detached).
        advantages: ``[B, T]`` (0 outside ``valid``).
        valid, keep: bool ``[B, T]``; ``keep`` (tokens in the loss numerator) within ``valid``.
    Returns:
        ``(ratio, advantages)``, both ``[B, T]``.
    """
    log_r = torch.where(valid, lp - ref, 0.0)
    if level == "token":
        return torch.exp(log_r), advantages
    if log_r.ndim != 2:
        raise ValueError("importance_sampling_level='sequence' needs [B, T] tensors")
    n_kept = keep.sum(dim=1, keepdim=True).clamp(min=1).to(log_r.dtype)
    seq_log_r = torch.where(keep, log_r, 0.0).sum(dim=1, keepdim=True) / n_kept
    seq_adv = torch.where(keep, advantages, 0.0).sum(dim=1, keepdim=True) / n_kept
    return torch.exp(seq_log_r).expand_as(log_r), seq_adv.expand_as(log_r)


def _check_loss_inputs(
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None,
    loss_agg_mode: str,
    **tensors: torch.Tensor,
) -> None:
    _check_bool_mask("loss_mask", loss_mask)
    for name, t in tensors.items():
        _check_tensor(name, t, floating=True)
    if m2po_mask is not None:
        _check_bool_mask("m2po_mask", m2po_mask)
    _check_same_shape("loss_mask", loss_mask, **tensors, m2po_mask=m2po_mask)
    _check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    rejection_sampling: Any = None,
    importance_sampling_level: str = "token",
    m2po_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    max_tokens_norm: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped (decoupled) PPO policy loss with dual clip, GSPO, rejection sampling and M2PO.

    Per valid token: ``r = exp(logprobs - proximal_logprobs)`` (or the GSPO sequence ratio,
    see :func:`_policy_ratio`), ``pg1 = -A r``, ``pg2 = -A clamp(r, 1 - eps_clip,
    1 + (eps_clip_higher or eps_clip))``, ``loss = max(pg1, pg2)``; with ``c_clip`` tokens with
    ``A < 0`` get ``min(loss, -A c_clip)``. The loss is multiplied by the detached behaviour
    weight ``w = exp(proximal_logprobs - old_logprobs)`` (1 when proximal == old: pass
    ``old_logprobs=proximal_logprobs`` for AReaL's decoupled loss without rejection sampling,
    which applies no behaviour weight), possibly clamped by ``rejection_sampling``. Numerator tokens: ``loss_mask & m2po_mask & rejection
    keep``; denominators from ``loss_mask`` (see :func:`agg_loss`).

    Args:
        logprobs: float ``[B, T]`` current policy log-probs (differentiable).
        proximal_logprobs: ``[B, T]`` policy at step start (ratio reference; detached here).
        old_logprobs: ``[B, T]`` behaviour log-probs from generation (detached here).
        advantages: ``[B, T]`` (detached here).
        eps_clip: >= 0; eps_clip_higher: >= 0 or None; c_clip: > 1 or None.
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` or None.
        rejection_sampling: None or an object/dict with ``level`` ("token"|"sequence"),
            ``action`` ("mask"|"clamp"), ``metric`` ("ratio"|"kl_k1"|"kl_k2"|"kl_k3", of
            proximal vs behaviour), ``agg`` ("mean"|"sum"|"max", sequence level; ratios are
            aggregated in log space and, at sequence level, the geometric-mean ratio becomes
            the sequence's behaviour weight), ``upper``/``lower`` (float|None). "mask" drops
            tokens/sequences out of ``[lower, upper]``; "clamp" (metric "ratio" only) clamps w.
        importance_sampling_level: "token" or "sequence" (GSPO).
        loss_agg_mode, max_tokens_norm: see :func:`agg_loss`.
    Returns:
        ``(loss, stats)``; stats (means over valid tokens unless named otherwise):
        ``actor/clip_fraction``, ``actor/dual_clip_fraction`` (kept tokens whose clipped /
        dual-clip branch is active, over valid tokens), ``actor/importance_weight`` (+ ``_max``,
        ``_min``), ``actor/approx_kl`` (proximal - current), ``actor/behave_imp_weight``
        (+ ``_max``), ``actor/behave_approx_kl`` (old - proximal), ``actor/rejected_fraction``
        (valid tokens rejected, or whose weight was clamped), ``actor/pg_loss``.
    """
    _check_loss_inputs(
        loss_mask,
        m2po_mask,
        loss_agg_mode,
        logprobs=logprobs,
        proximal_logprobs=proximal_logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
    )
    eps_lo = _check_real("eps_clip", eps_clip)
    if not eps_lo >= 0:
        raise ValueError(f"eps_clip must be >= 0, got {eps_lo}")
    eps_hi = eps_lo if eps_clip_higher is None else _check_real("eps_clip_higher", eps_clip_higher)
    if not eps_hi >= 0:
        raise ValueError(f"eps_clip_higher must be >= 0, got {eps_hi}")
    if c_clip is not None:
        cc = _check_real("c_clip", c_clip)
        if not cc > 1.0:
            raise ValueError(f"c_clip must be > 1, got {cc}")
    _check_choice("importance_sampling_level", importance_sampling_level, _IS_LEVELS)
    rs_cfg = _parse_rejection_sampling(rejection_sampling)

    dtype = _compute_dtype(logprobs, proximal_logprobs, old_logprobs, advantages)
    valid = loss_mask
    lp = logprobs.to(dtype)
    prox = proximal_logprobs.detach().to(dtype)
    old = old_logprobs.detach().to(dtype)
    adv = torch.where(valid, advantages.detach().to(dtype), 0.0)
    cand = valid if m2po_mask is None else valid & m2po_mask

    log_w = torch.where(valid, prox - old, 0.0)
    if rs_cfg is None:
        w = torch.exp(log_w)
        keep = cand
        affected = torch.zeros_like(valid)
    else:
        keep_rs, w, affected = _apply_rejection_sampling(
            rs_cfg, torch.where(cand, log_w, 0.0), cand, prox, old
        )
        # tokens outside cand (M2PO-masked) keep their raw weight for the statistics
        w = torch.where(cand, w, torch.exp(log_w))
        keep = cand & keep_rs

    ratio, adv = _policy_ratio(lp, prox, adv, valid, keep, importance_sampling_level)
    clipped = ratio.clamp(1.0 - eps_lo, 1.0 + eps_hi)
    pg1 = -adv * ratio
    pg2 = -adv * clipped
    clip_active = pg2.detach() > pg1.detach()
    pg = torch.maximum(pg1, pg2)
    if c_clip is not None:
        pg3 = -adv * float(c_clip)
        dual_active = (adv < 0) & (pg3 < pg.detach())
        pg = torch.where(dual_active, pg3, pg)
    else:
        dual_active = torch.zeros_like(valid)
    token_loss = pg * w
    loss = agg_loss(token_loss, keep, valid, loss_agg_mode, max_tokens_norm)

    with torch.no_grad():
        dev = logprobs.device
        n_valid = valid.sum().clamp(min=1)
        r = ratio.detach()
        has_valid = bool(valid.any())

        def _mean(x: torch.Tensor) -> torch.Tensor:
            return _scalar(masked_sum(x.to(torch.float64), valid) / n_valid, dev)

        def _ext(x: torch.Tensor, fn: str) -> torch.Tensor:
            if not has_valid:
                return _scalar(0.0, dev)
            return _scalar(getattr(x[valid], fn)(), dev)

        stats = {
            "actor/clip_fraction": _scalar((clip_active & keep).sum() / n_valid, dev),
            "actor/dual_clip_fraction": _scalar((dual_active & keep).sum() / n_valid, dev),
            "actor/importance_weight": _mean(r),
            "actor/importance_weight_max": _ext(r, "max"),
            "actor/importance_weight_min": _ext(r, "min"),
            "actor/approx_kl": _mean(prox - lp.detach()),
            "actor/behave_imp_weight": _mean(w),
            "actor/behave_imp_weight_max": _ext(w, "max"),
            "actor/behave_approx_kl": _mean(old - prox),
            "actor/rejected_fraction": _scalar(affected.sum() / n_valid, dev),
            "actor/pg_loss": _scalar(loss, dev),
        }
    return loss, stats


def sapo_loss_fn(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    max_tokens_norm: int | None = None,
    *,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization) loss: a soft sigmoid gate instead of a hard clip.

    With ``r = exp(logprobs - old_logprobs)`` (``old_logprobs`` = the proximal policy, the
    ratio's reference) and ``tau = tau_pos if A > 0 else tau_neg``, the token loss is
    ``-A * (4 / tau) * sigmoid(tau * (r - 1))`` (AReaL's gate). Its gradient is
    ``-A * g * r * grad(logprobs)`` with gate weight ``g = 4 s (1 - s)``,
    ``s = sigmoid(tau (r - 1))``: ``g = 1`` at ``r = 1`` (vanilla policy gradient), decaying
    smoothly off-policy. Same numerator/denominator/aggregation rules as
    :func:`ppo_actor_loss_fn`; ``importance_sampling_level="sequence"`` uses the GSPO ratio.

    Args:
        logprobs: float ``[B, T]`` (differentiable); old_logprobs, advantages: ``[B, T]``.
        tau_pos, tau_neg: gate temperatures (> 0).
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` or None.
    Returns:
        ``(loss, stats)`` with ``sapo/gate_mean``, ``sapo/gate_min``,
        ``sapo/soft_gate_fraction`` (valid tokens with ``g < 0.5``),
        ``actor/importance_weight``, ``actor/approx_kl`` (old - current), ``actor/pg_loss``.
    """
    _check_loss_inputs(
        loss_mask,
        m2po_mask,
        loss_agg_mode,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
    )
    tp = _check_real("tau_pos", tau_pos)
    tn = _check_real("tau_neg", tau_neg)
    if not tp > 0:
        raise ValueError(f"tau_pos must be > 0, got {tp}")
    if not tn > 0:
        raise ValueError(f"tau_neg must be > 0, got {tn}")
    _check_choice("importance_sampling_level", importance_sampling_level, _IS_LEVELS)
    dtype = _compute_dtype(logprobs, old_logprobs, advantages)
    valid = loss_mask
    keep = valid if m2po_mask is None else valid & m2po_mask
    lp = logprobs.to(dtype)
    ref = old_logprobs.detach().to(dtype)
    adv = torch.where(valid, advantages.detach().to(dtype), 0.0)
    ratio, adv = _policy_ratio(lp, ref, adv, valid, keep, importance_sampling_level)
    tau = torch.where(adv > 0, tp, tn).to(dtype)
    s = torch.sigmoid(tau * (ratio - 1.0))
    token_loss = -adv * (4.0 / tau) * s
    loss = agg_loss(token_loss, keep, valid, loss_agg_mode, max_tokens_norm)
    with torch.no_grad():
        dev = logprobs.device
        n_valid = valid.sum().clamp(min=1)
        sd = s.detach()
        gate = 4.0 * sd * (1.0 - sd)
        r = ratio.detach()
        stats = {
            "sapo/gate_mean": _scalar(masked_sum(gate, valid) / n_valid, dev),
            "sapo/gate_min": _scalar(gate[valid].min() if bool(valid.any()) else 0.0, dev),
            "sapo/soft_gate_fraction": _scalar((valid & (gate < 0.5)).sum() / n_valid, dev),
            "actor/importance_weight": _scalar(masked_sum(r, valid) / n_valid, dev),
            "actor/approx_kl": _scalar(masked_sum(ref - lp.detach(), valid) / n_valid, dev),
            "actor/pg_loss": _scalar(loss, dev),
        }
    return loss, stats


def ppo_critic_loss_fn(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, old - eps, old + eps) - R)^2)``.

    Args:
        values: float ``[B, T]`` (differentiable); old_values, returns: ``[B, T]`` (detached).
        value_eps_clip: >= 0, or None for the unclipped ``0.5 (v - R)^2``.
        loss_mask: bool ``[B, T]``.
    Returns:
        ``(loss, stats)`` with ``critic/value_clip_fraction`` (valid tokens where the clipped
        term is the larger), ``critic/value_loss``, ``critic/values_mean``.
    """
    _check_loss_inputs(
        loss_mask, None, loss_agg_mode, values=values, old_values=old_values, returns=returns
    )
    dtype = _compute_dtype(values, old_values, returns)
    v = values.to(dtype)
    old = old_values.detach().to(dtype)
    ret = returns.detach().to(dtype)
    l1 = (v - ret) ** 2
    if value_eps_clip is None:
        token_loss = 0.5 * l1
        clip_active = torch.zeros_like(loss_mask)
    else:
        eps = _check_real("value_eps_clip", value_eps_clip)
        if not eps >= 0:
            raise ValueError(f"value_eps_clip must be >= 0, got {eps}")
        v_clip = old + (v - old).clamp(-eps, eps)
        l2 = (v_clip - ret) ** 2
        token_loss = 0.5 * torch.maximum(l1, l2)
        clip_active = l2.detach() > l1.detach()
    loss = agg_loss(token_loss, loss_mask, loss_mask, loss_agg_mode)
    with torch.no_grad():
        dev = values.device
        n_valid = loss_mask.sum().clamp(min=1)
        stats = {
            "critic/value_clip_fraction": _scalar((clip_active & loss_mask).sum() / n_valid, dev),
            "critic/value_loss": _scalar(loss, dev),
            "critic/values_mean": _scalar(masked_sum(v.detach(), loss_mask) / n_valid, dev),
        }
    return loss, stats
