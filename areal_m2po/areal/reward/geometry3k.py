"""AReaL's ``areal.reward.geometry3k`` (areal-project/AReaL cbff54d6)."""

from areal_m2po.areal.reward.math_verify import extract_bracketed_answer as extract_answer
from areal_m2po.areal.reward.math_verify import geometry3k_reward_fn

__all__ = ["extract_answer", "geometry3k_reward_fn"]
