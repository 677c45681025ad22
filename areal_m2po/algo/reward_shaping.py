"""Reward shaping before the advantages: AReaL's affine transform and clip of the sequence
rewards, and DAPO's soft overlong penalty.

Owns :func:`reward_transform` and :func:`overlong_reward_penalty`; both take and return 1-D
``[B]`` sequence rewards (reward units). The module imports only torch and
:mod:`areal_m2po.algo.checks`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.checks import check_real, check_same_shape, check_tensor

__all__ = ["overlong_reward_penalty", "reward_transform"]


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
    check_tensor("rewards", rewards, floating=True)
    out = (rewards + check_real("bias", bias)) * check_real("scaling", scaling)
    if clip is not None:
        c = check_real("clip", clip)
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
    check_tensor("rewards", rewards, floating=True)
    check_tensor("completion_lengths", completion_lengths)
    check_same_shape("rewards", rewards, completion_lengths=completion_lengths)
    if not isinstance(overlong_tokens, int) or isinstance(overlong_tokens, bool):
        raise TypeError(f"overlong_tokens must be an int, got {type(overlong_tokens).__name__}")
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if not 0 < overlong_tokens <= max_new_tokens:
        raise ValueError(
            f"overlong_tokens must be in (0, max_new_tokens={max_new_tokens}], got {overlong_tokens}"
        )
    factor = check_real("overlong_penalty_factor", overlong_penalty_factor)
    if factor < 0:
        raise ValueError(f"overlong_penalty_factor must be >= 0, got {factor}")
    expected = max_new_tokens - overlong_tokens
    exceed = completion_lengths.to(rewards.dtype) - expected
    penalty = (-exceed / overlong_tokens * factor).clamp(max=0.0)
    return rewards + penalty
