"""Pure functions of AReaL's trainer modules that user code imports (areal-project/AReaL
cbff54d6): the proximal log-prob approximations of ``areal/trainer/ppo/actor.py`` with their
method names (``areal/utils/constants.py``), and ``compute_dpo_loss`` of
``areal/trainer/dpo/dpo_engine.py``.

* :func:`compute_prox_logp_approximations`: with the proximal version ``v_prox =
  current_version - 1`` and a token's behaviour version ``v``, ``alpha = (v_prox - v) /
  (current_version - v)`` clamped to [0, 1] (0 for prompt tokens, ``v < 0``, and where
  ``current_version <= v``); "loglinear": ``old + alpha * (new - old)``; "linear":
  ``log((1 - alpha) e^old + alpha e^new + 1e-10)``; "rollout": ``old``.
* :func:`compute_dpo_loss`: AReaL's packed pairs (``[chosen_0, rejected_0, ...]`` with
  ``cu_seqlens``), pairs with an empty sequence left out; sigmoid/hinge-style losses on
  ``(pi_c - pi_r) - (ref_c - ref_r)`` of the summed completion log-probs, IPO on the
  per-token averages; the mean over the kept pairs (0 when none). AReaL also logs
  statistics to its stats tracker; here :func:`dpo_pair_stats` gives them.

Imports torch and :mod:`areal_m2po.algo` only; keeps no state.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

from areal_m2po.algo.areal_compat import dpo_pair_logratios, dpo_preference_loss

__all__ = [
    "PROX_APPROX_METHODS_ALL",
    "PROX_APPROX_METHOD_LINEAR",
    "PROX_APPROX_METHOD_LOGLINEAR",
    "PROX_APPROX_METHOD_ROLLOUT",
    "PROX_LOGP_METHODS_ALL",
    "PROX_LOGP_METHOD_LOGLINEAR",
    "PROX_LOGP_METHOD_METRICS",
    "PROX_LOGP_METHOD_RECOMPUTE",
    "PROX_LOGP_METHOD_REUSE_TRAIN_LOGP",
    "ProxApproxMethod",
    "ProxLogpMethod",
    "compute_dpo_loss",
    "compute_prox_logp_approximations",
    "dpo_pair_stats",
]


class ProxLogpMethod(str, Enum):
    """How decoupled PPO gets the proximal log-probs: a forward pass ("recompute"), the
    log-linear approximation ("loglinear"), a forward pass plus approximation metrics
    ("metrics"), or the training forward's own log-probs ("reuse_train_logp")."""

    RECOMPUTE = "recompute"
    LOGLINEAR = "loglinear"
    METRICS = "metrics"
    REUSE_TRAIN_LOGP = "reuse_train_logp"

    def skips_forward_pass(self) -> bool:
        """Whether the method needs no separate forward pass."""
        return self in (ProxLogpMethod.LOGLINEAR, ProxLogpMethod.REUSE_TRAIN_LOGP)


class ProxApproxMethod(str, Enum):
    """The approximations :func:`compute_prox_logp_approximations` computes."""

    LOGLINEAR = "loglinear"
    LINEAR = "linear"
    ROLLOUT = "rollout"


PROX_LOGP_METHOD_RECOMPUTE = ProxLogpMethod.RECOMPUTE.value
PROX_LOGP_METHOD_LOGLINEAR = ProxLogpMethod.LOGLINEAR.value
PROX_LOGP_METHOD_METRICS = ProxLogpMethod.METRICS.value
PROX_LOGP_METHOD_REUSE_TRAIN_LOGP = ProxLogpMethod.REUSE_TRAIN_LOGP.value
PROX_LOGP_METHODS_ALL = [m.value for m in ProxLogpMethod]
PROX_APPROX_METHOD_LOGLINEAR = ProxApproxMethod.LOGLINEAR.value
PROX_APPROX_METHOD_LINEAR = ProxApproxMethod.LINEAR.value
PROX_APPROX_METHOD_ROLLOUT = ProxApproxMethod.ROLLOUT.value
PROX_APPROX_METHODS_ALL = [m.value for m in ProxApproxMethod]


def compute_prox_logp_approximations(
    old_logp: torch.Tensor,
    logprobs: torch.Tensor,
    versions: torch.Tensor,
    current_version: int,
    method: str | None = None,
) -> dict[str, torch.Tensor]:
    """Approximate proximal log-probs (see the module docstring).

    Args:
        old_logp: behaviour log-probs, any shape.
        logprobs: the current policy's, same shape.
        versions: int, the behaviour version per token (negative: prompt), same shape.
        current_version: the policy's version now.
        method: one name of :data:`PROX_APPROX_METHODS_ALL` (None: all of them).

    Returns:
        ``{method: tensor}`` for the method(s) asked (an unknown name gives nothing).
    """
    v = versions.float()
    span = float(current_version) - v
    gap = float(current_version - 1) - v
    alpha = torch.where((span > 0) & (versions >= 0), gap / span, torch.zeros_like(v))
    alpha = alpha.clamp(0.0, 1.0)
    out: dict[str, torch.Tensor] = {}
    for name in [method] if method else PROX_APPROX_METHODS_ALL:
        if name == PROX_APPROX_METHOD_LOGLINEAR:
            out[name] = old_logp + alpha * (logprobs - old_logp)
        elif name == PROX_APPROX_METHOD_LINEAR:
            mixed = (1 - alpha) * torch.exp(old_logp) + alpha * torch.exp(logprobs)
            out[name] = torch.log(mixed + 1e-10)
        elif name == PROX_APPROX_METHOD_ROLLOUT:
            out[name] = old_logp.clone()
    return out


def _dpo_valid_pairs(x: dict[str, Any]) -> torch.Tensor:
    """bool ``[P]``: the pairs whose two sequences are both non-empty."""
    lengths = x["cu_seqlens"][1:] - x["cu_seqlens"][:-1]
    return lengths.view(-1, 2).ne(0).all(dim=1)


def _dpo_loss_weight(x: dict[str, Any]) -> torch.Tensor:
    """The number of valid pairs (float), AReaL's loss weight of a DPO micro-batch."""
    return _dpo_valid_pairs(x).count_nonzero().float()


def _pair_logratios(logprobs: torch.Tensor, input_: dict[str, Any]) -> Any:
    device = logprobs.device
    valid = _dpo_valid_pairs(input_).to(device=device)
    if not valid.any():
        return None
    return dpo_pair_logratios(
        logprobs,
        input_["ref_logprobs"].to(device),
        input_["cu_seqlens"].to(device=device, dtype=torch.long),
        input_["loss_mask"].bool().to(device=device),
        valid,
    )


def compute_dpo_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    input_: dict[str, Any],
    *,
    beta: float,
    loss_type: str = "sigmoid",
    vocab_min_logits: torch.Tensor | None = None,
    vocab_max_logits: torch.Tensor | None = None,
    vocab_mean_logits: torch.Tensor | None = None,
    vocab_norm_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """AReaL's DPO loss of one packed micro-batch (see the module docstring).

    Args:
        logprobs: float ``[N]`` next-token log-probs of the packed sequences.
        entropy, vocab_*: taken for AReaL's call signature; unused.
        input_: ``cu_seqlens`` int ``[2P + 1]``, ``loss_mask`` ``[N]`` (completion tokens),
            ``ref_logprobs`` float ``[N]``.
        beta: the DPO temperature.
        loss_type: ``sigmoid`` or ``ipo`` (AReaL's ``dpo_preference_loss`` names).

    Raises:
        KeyError: ``ref_logprobs`` is missing.
    """
    ratios = _pair_logratios(logprobs, input_)
    if ratios is None:
        return torch.zeros((), dtype=torch.float32, device=logprobs.device)
    policy, ref, lens = ratios
    if loss_type == "ipo":
        chosen = (policy[:, 0] - ref[:, 0]) / lens[:, 0].clamp(min=1)
        rejected = (policy[:, 1] - ref[:, 1]) / lens[:, 1].clamp(min=1)
        logits = chosen - rejected
    else:
        logits = (policy[:, 0] - policy[:, 1]) - (ref[:, 0] - ref[:, 1])
    return dpo_preference_loss(logits, beta=beta, loss_type=loss_type).mean()


def dpo_pair_stats(
    logprobs: torch.Tensor, input_: dict[str, Any], beta: float
) -> dict[str, torch.Tensor]:
    """The per-pair statistics AReaL logs with :func:`compute_dpo_loss` (float32 ``[K]``):
    ``chosen_reward``/``rejected_reward`` (``beta`` times the summed log-ratio),
    ``reward_accuracy`` (chosen above rejected) and ``reward_margin``; empty without pairs."""
    ratios = _pair_logratios(logprobs.detach(), input_)
    if ratios is None:
        empty = torch.zeros(0, dtype=torch.float32, device=logprobs.device)
        return dict.fromkeys(
            ("chosen_reward", "rejected_reward", "reward_accuracy", "reward_margin"), empty
        )
    policy, ref, _ = ratios
    chosen = (beta * (policy[:, 0] - ref[:, 0])).float()
    rejected = (beta * (policy[:, 1] - ref[:, 1])).float()
    return {
        "chosen_reward": chosen,
        "rejected_reward": rejected,
        "reward_accuracy": (chosen > rejected).float(),
        "reward_margin": chosen - rejected,
    }
