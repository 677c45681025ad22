"""Rejection sampling on the behaviour drift: masked or truncated importance sampling of the
behaviour weight ``w = pi_prox / pi_behave`` per token or per sequence.

The options and their rules are those of :class:`areal_m2po.api.cli_args.RejectionSamplingConfig`
(one rule for the config file and for direct callers); a plain mapping or any object with the
same field names is turned into that config first. Per-token tensors are ``[B, T]``; the module
imports only torch, the standard library, the config tree's dataclass and the other pure-maths
modules, keeps no state and has no import-time side effects.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from areal_m2po.algo.kl import kl_estimate
from areal_m2po.api.cli_args import RejectionSamplingConfig

__all__ = ["apply_rejection_sampling", "as_rejection_config"]

# a mapping or object given by a direct caller: these defaults fill the fields it leaves out
_SPEC_DEFAULTS: dict[str, Any] = {
    "level": "token",
    "action": "mask",
    "metric": "ratio",
    "agg": "mean",
    "upper": None,
    "lower": None,
}


def as_rejection_config(spec: Any) -> RejectionSamplingConfig | None:
    """``spec`` as a validated :class:`RejectionSamplingConfig` (None stays None).

    A mapping or any object with the fields ``level``, ``action``, ``metric``, ``agg``,
    ``upper``, ``lower`` is accepted; fields it lacks take the defaults of the loss function
    (token level, mask, ratio, mean, no bound). Invalid values raise the config's one-line
    ``ConfigError`` (a ``ValueError``) naming the field, e.g. ``lower: must be < upper``.
    """
    if spec is None or isinstance(spec, RejectionSamplingConfig):
        return spec
    if isinstance(spec, Mapping):
        values = {k: spec.get(k, d) for k, d in _SPEC_DEFAULTS.items()}
    else:
        values = {k: getattr(spec, k, d) for k, d in _SPEC_DEFAULTS.items()}
    return RejectionSamplingConfig(**values)


def _in_bounds(metric: torch.Tensor, lower: float | None, upper: float | None) -> torch.Tensor:
    ok = torch.ones_like(metric, dtype=torch.bool)
    if lower is not None:
        ok &= metric >= lower
    if upper is not None:
        ok &= metric <= upper
    return ok


def _sequence_metric(
    cfg: RejectionSamplingConfig, vals: torch.Tensor, cand: torch.Tensor, n_row: torch.Tensor
) -> torch.Tensor:
    """The per-row ``[B, 1]`` aggregate of ``vals`` over the row's candidate tokens."""
    if cfg.agg == "sum":
        seq = vals.sum(dim=1, keepdim=True)
    elif cfg.agg == "mean":
        seq = vals.sum(dim=1, keepdim=True) / n_row.clamp(min=1)
    else:
        seq = torch.where(cand, vals, -math.inf).amax(dim=1, keepdim=True)
        seq = torch.where(n_row == 0, torch.zeros_like(seq), seq)
    return torch.exp(seq) if cfg.metric == "ratio" else seq


def apply_rejection_sampling(
    cfg: RejectionSamplingConfig,
    log_w: torch.Tensor,
    cand: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Apply ``cfg`` to the behaviour weights of the candidate tokens.

    Args:
        cfg: a validated config (see :func:`as_rejection_config`).
        log_w: float ``[B, T]`` log behaviour weight ``prox_logp - behave_logp``, 0 outside ``cand``.
        cand: bool ``[B, T]`` tokens still in the loss (valid and kept by M2PO).
        prox_logp, behave_logp: float ``[B, T]`` proximal / behaviour log-probs (for the KL
            metrics).
    Returns:
        ``(keep, w, affected)``: bool ``[B, T]`` keep mask, the float ``[B, T]`` behaviour
        weight to use, and the bool ``[B, T]`` candidate tokens rejected ("mask") or whose
        weight was clamped ("clamp"). At sequence level with metric "ratio", ratios are
        aggregated in log space and the row's geometric-mean ratio becomes every token's
        weight (AReaL's semantics).
    """
    w = torch.exp(log_w)
    lower, upper = cfg.lower, cfg.upper
    if cfg.metric == "ratio":
        metric = w
    else:
        metric = torch.where(cand, kl_estimate(prox_logp, behave_logp, cfg.metric[3:]), 0.0)
    if cfg.level == "token":
        if cfg.action == "mask":
            keep = _in_bounds(metric, lower, upper)
            return keep, w, cand & ~keep
        w_new = w.clamp(min=lower, max=upper)
        return torch.ones_like(cand), w_new, cand & (w_new != w)
    if log_w.ndim != 2:
        raise ValueError("rejection_sampling.level='sequence' needs [B, T] tensors")
    n_row = cand.sum(dim=1, keepdim=True)
    if cfg.metric == "ratio":
        vals = log_w
        w = torch.exp(vals.sum(dim=1, keepdim=True) / n_row.clamp(min=1)).expand_as(log_w)
    else:
        vals = metric
    ok = _in_bounds(_sequence_metric(cfg, vals, cand, n_row), lower, upper) | (n_row == 0)
    if cfg.action == "mask":
        keep = ok.expand_as(cand)
        return keep, w, cand & ~keep
    w_new = torch.where(ok, w, w.clamp(min=lower, max=upper))
    return torch.ones_like(cand), w_new, cand & (w_new != w)
