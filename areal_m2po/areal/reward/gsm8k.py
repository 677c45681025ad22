"""AReaL's ``areal.reward.gsm8k`` (areal-project/AReaL cbff54d6):
``reward.path=areal_m2po.areal.reward.gsm8k:gsm8k_reward_fn`` (or AReaL's own
``areal.reward.gsm8k.gsm8k_reward_fn``, which the loader maps here when AReaL is not
installed)."""

from areal_m2po.areal.reward.math_verify import gsm8k_reward_fn

__all__ = ["gsm8k_reward_fn"]
