"""AReaL's reward helpers (``areal.reward`` at areal-project/AReaL cbff54d6): the
``math_verify`` answer checker and the GSM8K and Geometry3K reward functions, with AReaL's
signature ``fn(prompt, completions, prompt_ids, completion_ids, answer, **kwargs) -> float``
(``reward.path=areal_m2po.areal.reward:gsm8k_reward_fn`` takes it as it is).
"""

from areal_m2po.areal.reward.math_verify import (
    MathVerifyWorker,
    geometry3k_reward_fn,
    get_math_verify_worker,
    gsm8k_reward_fn,
)

__all__ = [
    "MathVerifyWorker",
    "geometry3k_reward_fn",
    "get_math_verify_worker",
    "gsm8k_reward_fn",
]
