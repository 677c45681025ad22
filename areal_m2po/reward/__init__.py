"""Verifiable rewards: math answer checking, reward-function loading (this trainer's and
AReaL's signature, checked by :func:`check_reward_fn`) and batched scoring."""

from areal_m2po.reward.math_reward import (
    extract_answer,
    extract_ground_truth,
    math_reward_fn,
    normalise_number,
)
from areal_m2po.reward.runner import RewardFn, RewardRunner, load_reward_fn
from areal_m2po.reward.signature import RewardCall, check_reward_fn

__all__ = [
    "RewardCall",
    "RewardFn",
    "RewardRunner",
    "check_reward_fn",
    "extract_answer",
    "extract_ground_truth",
    "load_reward_fn",
    "math_reward_fn",
    "normalise_number",
]
