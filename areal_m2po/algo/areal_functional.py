"""AReaL's functional helpers beyond the losses (areal-project/AReaL cbff54d6,
``areal/utils/functional/functional.py`` and ``areal/utils/data.py``), with AReaL's names,
arguments and results:

* :class:`KLEstimator`: Schulman's k1/k2/k3 of ``log_probs - log_probs_base`` in float32,
  clamped to [-10, 10] unless ``apply_clamp=False`` (:func:`~areal_m2po.algo.kl.kl_estimate`).
* :func:`masked_normalization`: ``(x - mean) / (std + eps)`` over ``dim`` (all dims by
  default) and the mask's elements, in float64 unless ``high_precision=False``, the sums
  all-reduced over the process group when one is initialised; float32 out.
* :func:`reward_overlong_penalty`: DAPO's soft length penalty, added to ``data["rewards"]`` in
  place: ``min(-(L - (max_response_length - overlong_tokens)) / overlong_tokens * factor, 0)``
  for a response of ``L`` loss-mask tokens.
* :func:`apply_rejection_sampling` with AReaL's signature (``proximal_logprobs,
  old_logprobs, loss_mask, cu_seqlens, config``) returning :class:`RejectionSamplingResult`;
  this package's own ``[B, T]`` form keeps its name in
  :mod:`areal_m2po.algo.rejection_sampling`.

Imports torch and :mod:`areal_m2po.algo` only; keeps no state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.algo.kl import binary_kl, kl_estimate

__all__ = [
    "KLEstimator",
    "RejectionSamplingResult",
    "apply_rejection_sampling",
    "compute_binary_kl_divergence",
    "masked_normalization",
    "reward_overlong_penalty",
]


class KLEstimator:
    """``KLEstimator(kl_estimator="k1", apply_clamp=True)(log_probs, log_probs_base)``: the
    per-token estimate, float32, of ``log_probs``' shape."""

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
    module docstring); masked-out positions come out as ``-mean / (std + eps)``."""
    dtype = torch.float64 if high_precision else torch.float32
    x = x.to(dtype)
    dims = tuple(range(x.ndim)) if dim is None else dim
    if mask is None:
        count = torch.ones_like(x).sum(dims, keepdim=True)
    else:
        m = mask.to(dtype)
        x = x * m
        count = m.sum(dims, keepdim=True)
    total = x.sum(dim=dims, keepdim=True)
    total_sq = (x * x).sum(dim=dims, keepdim=True)
    dist = torch.distributed
    if all_reduce and dist.is_available() and dist.is_initialized():
        for t in (count, total, total_sq):
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=reduce_group)
    mean = total / count
    var = total_sq / count - mean * mean
    if unbiased:
        var = var * count / (count - 1)
    return ((x - mean) / (var.sqrt() + eps)).float()


def reward_overlong_penalty(
    data: dict[str, Any],
    overlong_tokens: int,
    overlong_penalty_factor: float,
    max_response_length: int,
) -> dict[str, Any]:
    """``data`` with DAPO's overlong penalty added to ``data["rewards"]`` ``[B]`` (in place);
    the response length is ``data["loss_mask"].sum(-1)``."""
    rewards = data["rewards"]
    lengths = data["loss_mask"].sum(dim=-1).long()
    excess = lengths - (max_response_length - overlong_tokens)
    penalty = (-excess / overlong_tokens * overlong_penalty_factor).clamp(max=0)
    rewards += penalty.to(rewards.dtype)
    data["rewards"] = rewards
    return data


@dataclass
class RejectionSamplingResult:
    """What :func:`apply_rejection_sampling` gives.

    Attributes:
        loss_mask: the mask after rejection ("mask"), or the input mask ("clamp").
        behave_imp_weight: ``pi_prox / pi_behave`` per token (clamped where "clamp" acted;
            the sequence's geometric mean at sequence level with metric "ratio"), 0 outside the
            returned mask.
        filtered_fraction: share of the input mask's tokens rejected or clamped.
    """

    loss_mask: torch.Tensor
    behave_imp_weight: torch.Tensor
    filtered_fraction: float


def compute_binary_kl_divergence(
    log_p: torch.Tensor, log_q: torch.Tensor, eps: float = 1e-8
) -> torch.Tensor:
    """KL between Bernoulli(p) and Bernoulli(q), ``p = exp(log_p)``, ``q = exp(log_q)``, both
    clamped to ``[eps, 1 - eps]`` (:func:`areal_m2po.algo.kl.binary_kl`)."""
    return binary_kl(log_p, log_q, eps)


def _metric(prox: torch.Tensor, old: torch.Tensor, log_ratio: torch.Tensor, name: str):
    if name == "ratio":
        return torch.exp(log_ratio)
    if name in ("kl_k1", "kl_k2", "kl_k3"):
        return KLEstimator._compute_approx_kl(prox, old, name[3:], apply_clamp=False)
    if name == "binary_kl":
        fwd = compute_binary_kl_divergence(prox, old)
        return torch.maximum(fwd, compute_binary_kl_divergence(old, prox))
    raise ValueError(f"Unknown metric: {name}")


def _in_bounds(metric: torch.Tensor, config: Any) -> torch.Tensor:
    ok = metric <= config.upper
    return ok & (metric >= config.lower) if config.lower is not None else ok


def _sequence_index(mask: torch.Tensor, cu_seqlens: torch.Tensor | None) -> tuple[Any, int]:
    """Per-token sequence index (flat) and the sequence count."""
    if mask.ndim == 2:
        b, t = mask.shape
        return torch.arange(b, device=mask.device).repeat_interleave(t), b
    if cu_seqlens is None:
        raise ValueError(
            "cu_seqlens is required for 1D packed tensors in sequence-level filtering."
        )
    n = cu_seqlens.shape[0] - 1
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(mask.device)
    return torch.arange(n, device=mask.device).repeat_interleave(lengths), n


def _per_sequence(values: torch.Tensor, idx: torch.Tensor, n: int, reduce: str) -> torch.Tensor:
    init = float("-inf") if reduce == "amax" else 0.0
    out = torch.full((n,), init, dtype=values.dtype, device=values.device)
    return out.scatter_reduce_(0, idx, values, reduce=reduce, include_self=True)


def _sequence_level(config, metric, log_ratio, weight, mask, cu_seqlens):
    """``(in_bounds per token, behaviour weight)`` at sequence level (flat tensors)."""
    idx, n = _sequence_index(mask, cu_seqlens)
    valid = mask.reshape(-1).bool()
    log_agg = config.metric == "ratio"
    vals = (log_ratio if log_agg else metric).reshape(-1)
    masked = torch.where(valid, vals, 0.0)
    n_valid = _per_sequence(valid.to(vals.dtype), idx, n, "sum")
    denom = n_valid.clamp(min=1)
    if log_agg:
        weight = torch.exp(_per_sequence(masked, idx, n, "sum") / denom)[idx]
    if config.agg == "sum":
        seq = _per_sequence(masked, idx, n, "sum")
    elif config.agg == "mean":
        seq = _per_sequence(masked, idx, n, "sum") / denom
    elif config.agg == "max":
        seq = _per_sequence(vals.masked_fill(~valid, float("-inf")), idx, n, "amax")
        seq = torch.where(n_valid == 0, torch.zeros_like(seq), seq)
    else:
        raise ValueError(f"Unknown agg method: {config.agg}")
    ok = _in_bounds(torch.exp(seq) if log_agg else seq, config)[idx]
    return ok, weight.reshape(-1)


def apply_rejection_sampling(
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    config: Any,
) -> RejectionSamplingResult:
    """AReaL's rejection sampling of the proximal-vs-behaviour drift.

    Args:
        proximal_logprobs, old_logprobs, loss_mask: ``[B, T]`` padded or ``[N]`` packed.
        cu_seqlens: int ``[B + 1]`` sequence boundaries of packed inputs (sequence level).
        config: AReaL's ``RejectionSamplingConfig`` or anything with its fields ``level``,
            ``action``, ``metric`` (ratio, kl_k1/k2/k3, binary_kl), ``agg``, ``upper``,
            ``lower``.

    Raises:
        ValueError: mismatched shapes, not 1-D or 2-D, a packed sequence-level call without
            ``cu_seqlens``, an unknown metric or aggregation.
    """
    shape = proximal_logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ValueError(f"proximal_logprobs shape {shape} != {name} shape {t.shape}")
    if proximal_logprobs.ndim not in (1, 2):
        raise ValueError(
            f"Expected 1D (packed) or 2D (padded) tensors, got ndim={proximal_logprobs.ndim}"
        )
    prox, old = proximal_logprobs.detach(), old_logprobs.detach()
    log_ratio = prox.float() - old.float()
    log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)
    metric = _metric(prox, old, log_ratio, config.metric)
    weight = torch.exp(log_ratio)
    lower = config.lower if config.lower is not None else 0.0
    if config.level == "sequence":
        ok, weight = _sequence_level(config, metric, log_ratio, weight, loss_mask, cu_seqlens)
        ok, weight = ok.reshape(shape), weight.reshape(shape)
        raw = weight
        if config.action != "mask":
            weight = torch.where(ok, weight, weight.clamp(min=lower, max=config.upper))
    else:
        ok, raw = _in_bounds(metric, config), weight
        if config.action != "mask":
            weight = weight.clamp(min=lower, max=config.upper)
    valid = loss_mask.bool()
    if config.action == "mask":
        new_mask = (valid & ok).to(loss_mask.dtype)
        affected = valid & ~ok
    else:
        new_mask = loss_mask
        affected = valid & (raw != weight)
    fraction = affected.sum().item() / max(valid.sum().item(), 1)
    weight = torch.where(new_mask.bool(), weight, 0.0)
    return RejectionSamplingResult(new_mask, weight, fraction)
