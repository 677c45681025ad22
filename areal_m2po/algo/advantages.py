"""Advantage estimators: the contract of the ``actor.adv_estimator`` seam and the built-ins
(``grpo``, ``gae``, ``rloo``, ``reinforce_pp``), with GAE itself.

An estimator maps :class:`AdvantageInputs` (each row's shaped score, the per-token KL penalty,
the critic's values, ...) to ``(advantages, returns)``:

* ``advantages``: float ``[B]`` (one advantage per sequence, carried by each of its valid
  tokens; ``actor.adv_norm`` then weighs rows by ``actor.adv_norm_weighting``) or float
  ``[B, T]`` (per token; ``actor.adv_norm`` is token-weighted), in reward units;
* ``returns``: float ``[B, T]`` value targets of the critic, or None (the advantages).

The built-ins (:data:`ADV_ESTIMATORS`), for scores ``r_i`` of a group ``g`` of ``G``
consecutive rows (the samples of one prompt):

* :func:`grpo_advantages`: ``A_i = r_i`` per sequence; the group normalisation is
  ``actor.adv_norm`` (default: group mean and std, GRPO).
* :func:`gae_advantages`: token rewards (the KL penalty, the score on the last valid token)
  through GAE with the critic's values (zeros without a critic: discounted REINFORCE).
* :func:`rloo_advantages`: ``A_i = r_i - mean_{j in g, j != i} r_j`` (RLOO's leave-one-out
  baseline, Ahmadian et al. 2024; ``G >= 2``).
* :func:`reinforce_pp_advantages`: REINFORCE++ with baseline as verl defines it
  (``reinforce_plus_plus_baseline``): ``c_i = r_i - mean_g r`` (0 baseline for a group of
  one), carried by every valid token, then whitened over all valid tokens of the batch:
  ``(c - mean) / sqrt(var + 1e-8)`` with the unbiased token variance.

Per-token tensors are ``[B, T]`` with a ``torch.bool`` ``loss_mask``. The module imports only
torch, the standard library and the other modules of :mod:`areal_m2po.algo` (the built-ins'
names, ``ADV_ESTIMATORS``, are :mod:`areal_m2po.algo.options`'); it keeps no state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from areal_m2po.algo.checks import check_bool_mask, check_real, check_same_shape, check_tensor
from areal_m2po.algo.options import ADV_ESTIMATORS
from areal_m2po.algo.reductions import compute_dtype

__all__ = [
    "AdvantageEstimator",
    "AdvantageInputs",
    "builtin_estimator",
    "gae_advantages",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
]

WHITEN_EPS = 1e-8
"""Added to the variance before the square root in REINFORCE++'s whitening (verl's)."""


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator gets for one rank's batch of ``B`` rows padded to ``T``.

    Attributes:
        scores: float32 ``[B]``, each row's score after reward shaping (overlong penalty,
            ``reward_scaling``/``bias``/``clip``, ``reward_norm``, ``mask_no_eos_with_zero``).
        loss_mask: bool ``[B, T]``, the generated tokens that count.
        group_size: rows per prompt; groups are consecutive rows (1 when the batch's rows do
            not form whole groups).
        token_rewards: float32 ``[B, T]``, the per-token reward besides the score (the KL
            penalty ``-kl_ctl * KL``, 0 outside ``loss_mask``), or None without one.
        values: float32 ``[B, T]``, the critic's values at step start, or None without a critic.
        discount, gae_lambda: GAE's gamma and lambda.
        batch_sum: sums a float64 tensor over the shards of a batch split across processes (an
            all-reduce), so batch statistics cover the global batch; None: this is the batch.
    """

    scores: torch.Tensor
    loss_mask: torch.Tensor
    group_size: int = 1
    token_rewards: torch.Tensor | None = None
    values: torch.Tensor | None = None
    discount: float = 1.0
    gae_lambda: float = 1.0
    batch_sum: Callable[[torch.Tensor], torch.Tensor] | None = None


AdvantageEstimator = Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor | None]]
"""``(inputs) -> (advantages, returns)``; see the module docstring for the shapes."""


def _grouped(inputs: AdvantageInputs, name: str, min_size: int = 1) -> torch.Tensor:
    """The scores as float64 ``[B // G, G]`` (one row per group), checked."""
    scores = check_tensor("scores", inputs.scores, floating=True)
    if scores.ndim != 1:
        raise ValueError(f"{name}: scores must be 1-D [B], got shape {tuple(scores.shape)}")
    size = inputs.group_size
    if isinstance(size, bool) or not isinstance(size, int) or size < min_size:
        raise ValueError(f"{name}: group_size must be an int >= {min_size}, got {size!r}")
    if scores.numel() % size:
        raise ValueError(f"{name}: {scores.numel()} rows do not form groups of {size}")
    return scores.detach().to(torch.float64).view(-1, size)


def _outcome_only(inputs: AdvantageInputs, name: str) -> None:
    if inputs.token_rewards is not None:
        raise ValueError(
            f"{name} takes one score per sequence; per-token rewards (the KL penalty) need gae"
        )


def grpo_advantages(inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """GRPO: each row's score is its advantage (``[B]``); ``actor.adv_norm`` normalises it
    within the group. Raises ValueError with per-token rewards."""
    _outcome_only(inputs, "grpo")
    return check_tensor("scores", inputs.scores, floating=True), None


def rloo_advantages(inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """RLOO: ``A_i = r_i - (sum_g r - r_i) / (G - 1)``, ``[B]`` (computed in float64, returned
    in the scores' dtype). Raises ValueError for ``G < 2`` or per-token rewards."""
    _outcome_only(inputs, "rloo")
    x = _grouped(inputs, "rloo", min_size=2)
    baseline = (x.sum(dim=1, keepdim=True) - x) / (x.shape[1] - 1)
    return (x - baseline).reshape(-1).to(inputs.scores.dtype), None


def reinforce_pp_advantages(inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """REINFORCE++ with baseline (verl's ``reinforce_plus_plus_baseline``), ``[B, T]``.

    ``c_i = r_i - mean_g r`` (a group of one keeps ``r_i``), on each valid token of row ``i``,
    whitened over the valid tokens of the whole batch (all ranks with ``batch_sum``):
    ``(c - m) / sqrt(v + 1e-8)``, ``m`` the token mean and ``v`` the unbiased token variance
    (0 with fewer than two tokens); 0 outside ``loss_mask``.
    """
    _outcome_only(inputs, "reinforce_pp")
    x = _grouped(inputs, "reinforce_pp")
    mask = check_bool_mask("loss_mask", inputs.loss_mask)
    if mask.ndim != 2 or mask.shape[0] != inputs.scores.shape[0]:
        raise ValueError(
            f"reinforce_pp: loss_mask must be [B, T] with B={inputs.scores.shape[0]} rows, "
            f"got {tuple(mask.shape)}"
        )
    centred = (x - x.mean(dim=1, keepdim=True)) if x.shape[1] > 1 else x
    tok = torch.where(mask, centred.reshape(-1, 1), 0.0)
    total = inputs.batch_sum or (lambda t: t)
    n, s = total(torch.stack([mask.sum().to(torch.float64), tok.sum()])).unbind()
    mean = s / n.clamp(min=1)
    dev = torch.where(mask, tok - mean, 0.0)
    ss = total((dev * dev).sum())
    var = torch.where(n > 1, ss / (n - 1).clamp(min=1), torch.zeros_like(ss))
    adv = torch.where(mask, dev * torch.rsqrt(var + WHITEN_EPS), 0.0)
    return adv.to(inputs.scores.dtype), None


def _gae_estimator(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``gae`` built-in: the KL penalty plus the score on each row's last valid token,
    through :func:`gae_advantages` with the critic's values (zeros without a critic)."""
    mask = check_bool_mask("loss_mask", inputs.loss_mask)
    mask_f = mask.float()
    rewards = torch.zeros_like(mask_f) if inputs.token_rewards is None else inputs.token_rewards
    last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    rewards = rewards + inputs.scores[:, None] * last.float()
    values = torch.zeros_like(mask_f) if inputs.values is None else inputs.values
    return gae_advantages(rewards, values, mask, inputs.discount, inputs.gae_lambda)


_BUILTINS: dict[str, AdvantageEstimator] = {
    "grpo": grpo_advantages,
    "gae": _gae_estimator,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
}


def builtin_estimator(name: str) -> AdvantageEstimator:
    """The built-in estimator called ``name`` (one of :data:`ADV_ESTIMATORS`)."""
    if name not in _BUILTINS:
        raise ValueError(f"unknown advantage estimator {name!r}; built-ins: {ADV_ESTIMATORS}")
    return _BUILTINS[name]


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
    check_tensor("token_rewards", token_rewards, floating=True)
    check_tensor("values", values, floating=True)
    check_bool_mask("loss_mask", loss_mask)
    check_same_shape("loss_mask", loss_mask, token_rewards=token_rewards, values=values)
    if loss_mask.ndim != 2:
        raise ValueError(f"loss_mask must be 2-D [B, T], got shape {tuple(loss_mask.shape)}")
    gamma = check_real("discount", discount)
    lam = check_real("gae_lambda", gae_lambda)
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
