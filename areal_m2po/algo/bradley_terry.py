"""Pure tensor maths of a Bradley-Terry reward model: the pairwise loss, its metrics, and the
position a sequence-level score is read from.

A reward model maps a (prompt, completion) text to one scalar ``r``. Under the Bradley-Terry
model the probability that a labeller prefers ``chosen`` over ``rejected`` is
``sigmoid(r_chosen - r_rejected)``; training minimises the negative log-likelihood of the
observed preferences (InstructGPT; TRL's ``RewardTrainer``)::

    loss = mean_i( -log sigmoid(r_chosen_i - r_rejected_i - margin_i) )
           + center_rewards_coefficient * mean_i( (r_chosen_i + r_rejected_i)^2 )

``margin_i`` (optional, per pair, TRL's ``margin`` column) asks for a gap of at least that size;
the centring term (TRL's ``center_rewards_coefficient``, from Eisenstein et al. 2023) keeps the
rewards near zero mean, since the loss itself only sees differences.

All rewards are 1-D float tensors ``[P]`` (``P`` pairs), in the model's output units. The module
imports only torch, keeps no state and has no import-time side effects.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "bradley_terry_loss",
    "last_token_index",
    "pairwise_accuracy",
    "pool_last_token",
    "preference_stats",
]


def _check_pair_shapes(chosen: torch.Tensor, rejected: torch.Tensor) -> None:
    if chosen.dim() != 1 or chosen.shape != rejected.shape:
        raise ValueError(
            "chosen_rewards and rejected_rewards must be 1-D tensors of the same length, got "
            f"{tuple(chosen.shape)} and {tuple(rejected.shape)}"
        )
    if chosen.numel() == 0:
        raise ValueError("chosen_rewards is empty: no preference pairs to score")


def bradley_terry_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float = 0.0,
) -> torch.Tensor:
    """The Bradley-Terry pairwise loss, averaged over pairs (0-dim tensor).

    Args:
        chosen_rewards: ``[P]`` rewards of the preferred completions.
        rejected_rewards: ``[P]`` rewards of the other completions.
        margin: optional ``[P]`` required reward gap per pair (TRL's ``margin`` column).
        center_rewards_coefficient: weight of ``mean((r_chosen + r_rejected)^2)`` (0: off).

    Written with ``logsigmoid`` (``softplus`` of the negated gap), so it is finite and has
    finite gradients for any finite rewards, however large the gap.
    """
    _check_pair_shapes(chosen_rewards, rejected_rewards)
    gap = chosen_rewards - rejected_rewards
    if margin is not None:
        if margin.shape != gap.shape:
            raise ValueError(
                f"margin must have shape {tuple(gap.shape)} (one per pair), got "
                f"{tuple(margin.shape)}"
            )
        gap = gap - margin.to(gap.dtype)
    loss = -F.logsigmoid(gap).mean()
    if center_rewards_coefficient:
        if center_rewards_coefficient < 0:
            raise ValueError(
                f"center_rewards_coefficient must be >= 0, got {center_rewards_coefficient}"
            )
        loss = loss + center_rewards_coefficient * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


def pairwise_accuracy(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """Fraction of pairs whose chosen reward is strictly higher (a tie counts as wrong).

    Returns a detached 0-dim float32 tensor in [0, 1].
    """
    _check_pair_shapes(chosen_rewards, rejected_rewards)
    return (chosen_rewards.detach() > rejected_rewards.detach()).float().mean()


def preference_stats(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor
) -> dict[str, torch.Tensor]:
    """TRL's reward-model metrics over a batch of pairs (detached 0-dim float32 tensors).

    ``accuracy`` (see :func:`pairwise_accuracy`), ``margin`` (mean ``r_chosen - r_rejected``),
    ``mean_reward``, ``min_reward`` and ``max_reward`` over all ``2P`` rewards.
    """
    _check_pair_shapes(chosen_rewards, rejected_rewards)
    c, r = chosen_rewards.detach().float(), rejected_rewards.detach().float()
    both = torch.cat([c, r])
    return {
        "accuracy": pairwise_accuracy(c, r),
        "margin": (c - r).mean(),
        "mean_reward": both.mean(),
        "min_reward": both.min(),
        "max_reward": both.max(),
    }


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Column of the last attended token of each row: ``[B]`` int64.

    ``attention_mask`` is ``[B, T]`` (bool or 0/1) with padding on either side. The result is
    the largest ``t`` with ``attention_mask[b, t]`` set, so left- and right-padded rows both
    give their last real token. A row with no attended token raises ``ValueError``.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, T], got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    empty = ~mask.any(-1)
    if bool(empty.any()):
        rows = torch.nonzero(empty).flatten().tolist()
        raise ValueError(f"attention_mask rows {rows} have no tokens to score")
    cols = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, cols, torch.full_like(cols, -1)).max(-1).values


def pool_last_token(values: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``values[b, last_token_index(attention_mask)[b]]``: ``[B, T]`` (or ``[B, T, 1]``) -> ``[B]``."""
    if values.dim() == 3 and values.shape[-1] == 1:
        values = values[..., 0]
    if values.shape != attention_mask.shape:
        raise ValueError(
            f"values {tuple(values.shape)} and attention_mask {tuple(attention_mask.shape)} "
            "must have the same [B, T] shape"
        )
    idx = last_token_index(attention_mask).to(values.device)
    return values.gather(1, idx[:, None])[:, 0]
