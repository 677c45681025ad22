"""How one optimizer step's loss stats combine over micro-batches and ranks.

A loss function reports per-micro-batch stats (0-dim tensors). Mean stats are summed with the
micro-batch's loss weight and divided by the step's total weight; stats named ``*_max`` /
``*_min`` are extrema over tokens, so they combine as extrema over the micro-batches (with a
positive weight) and over ranks, never as weighted means.
"""

from __future__ import annotations

import math

import torch

from areal_m2po.utils import dist

__all__ = ["accumulate_stat", "as_f64", "extremum", "global_extrema", "global_step_stats"]


def as_f64(x: torch.Tensor | float) -> torch.Tensor:
    """A detached float64 0-dim CPU-or-device tensor (no host sync for device tensors)."""
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(()).to(torch.float64)
    return torch.tensor(float(x), dtype=torch.float64)


def extremum(key: str) -> str | None:
    """``"max"`` / ``"min"`` for a loss stat that is an extremum over tokens, else None."""
    for kind in ("max", "min"):
        if key.endswith(f"_{kind}"):
            return kind
    return None


def accumulate_stat(
    key: str, acc: torch.Tensor | float | None, value: torch.Tensor, weight: float
) -> torch.Tensor | float:
    """One micro-batch's ``value`` of stat ``key`` added to ``acc`` (None: the first): weighted
    sum for a mean stat; for an extremum stat, the extremum over micro-batches with a positive
    weight (a micro-batch without tokens reports a placeholder 0), ``-inf``/``+inf`` until one."""
    kind = extremum(key)
    if kind is None:
        return (0.0 if acc is None else acc) + value * weight
    if acc is None:
        acc = torch.full_like(value, -math.inf if kind == "max" else math.inf)
    elif not isinstance(acc, torch.Tensor):  # an extremum accumulates as a tensor
        acc = torch.as_tensor(acc, dtype=value.dtype, device=value.device)
    if weight <= 0:
        return acc
    return torch.maximum(acc, value) if kind == "max" else torch.minimum(acc, value)


def global_extrema(keys: list[str], local: list[float]) -> dict[str, float]:
    """Extremum stats over all ranks (one all-reduce); 0 when no rank had a token."""
    signs = [1.0 if extremum(k) == "max" else -1.0 for k in keys]
    if not keys:
        return {}
    both = dist.all_reduce_max(
        torch.tensor([s * v for s, v in zip(signs, local)], dtype=torch.float64)
    ).tolist()
    return {k: s * v if math.isfinite(v) else 0.0 for k, s, v in zip(keys, signs, both)}


def global_step_stats(
    grad_norm: torch.Tensor,
    loss_total: torch.Tensor | float,
    stat_sums: dict[str, torch.Tensor | float],
    stat_weight: float,
    device: torch.device,
) -> tuple[float, bool, dict[str, float]]:
    """The step's grad norm, whether every rank's loss is finite and its loss stats, the
    same on every rank.

    One host sync for this rank's values (gathered on ``device``), then one all-reduce; each
    loss stat is its weighted sum over all ranks divided by the total weight (``stat_weight``
    summed over ranks; 1 when zero), each extremum stat its extremum over ranks.
    """
    keys = sorted(k for k in stat_sums if extremum(k) is None)
    ext_keys = sorted(k for k in stat_sums if extremum(k) is not None)
    values = [grad_norm, loss_total] + [stat_sums[k] for k in keys + ext_keys]
    host = torch.stack([as_f64(v).to(device) for v in values]).tolist()
    grad_norm_f, loss_total_f = host[0], host[1]
    sums = dist.all_reduce_sum(
        torch.tensor(
            host[2 : 2 + len(keys)] + [stat_weight, 0.0 if math.isfinite(loss_total_f) else 1.0],
            dtype=torch.float64,
        )
    ).tolist()
    denom = sums[-2] if sums[-2] > 0 else 1.0
    loss_stats = {k: v / denom for k, v in zip(keys, sums)}
    loss_stats.update(global_extrema(ext_keys, host[2 + len(keys) :]))
    return grad_norm_f, sums[-1] == 0, loss_stats
