"""Reward and advantage maths: reward shaping, the DAPO overlong penalty, KL estimators,
group / token-level normalisation and GAE.

Conventions: per-token tensors are padded 2-D ``[B, T]`` (``B`` sequences, ``T`` positions)
unless a docstring says otherwise; ``loss_mask`` is a ``torch.bool`` ``[B, T]`` tensor, True on
generated tokens that count ("valid" tokens); log-probs are in nats, aligned to their token, and
arbitrary at masked positions (never read unmasked).

The module imports only torch, the standard library, the choice lists of
:mod:`areal_m2po.api.cli_args` and the other pure-maths modules of ``areal_m2po.utils``, keeps no state and has no import-time side effects.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from areal_m2po.api.cli_args import KL_ESTIMATORS, NORM_LEVELS
from areal_m2po.utils.checks import check_bool_mask as _check_bool_mask
from areal_m2po.utils.checks import check_choice as _check_choice
from areal_m2po.utils.checks import check_real as _check_real
from areal_m2po.utils.checks import check_same_shape as _check_same_shape
from areal_m2po.utils.checks import check_tensor as _check_tensor
from areal_m2po.utils.reductions import compute_dtype

__all__ = [
    "gae_advantages",
    "group_normalize",
    "kl_estimate",
    "masked_normalize",
    "overlong_reward_penalty",
    "reward_transform",
]


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
    _check_choice("estimator", estimator, KL_ESTIMATORS)
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
    _check_choice("mean_level", mean_level, NORM_LEVELS)
    _check_choice("std_level", std_level, NORM_LEVELS)
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
    dtype = compute_dtype(token_rewards, values)
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
