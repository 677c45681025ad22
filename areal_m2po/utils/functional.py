"""AReaL-compatible names of the pure tensor maths, re-exported from the modules that hold them.

Code ported from AReaL imports ``ppo_actor_loss_fn``, ``sapo_loss_fn``, ``ppo_critic_loss_fn``
and friends from ``areal.utils.functional``; the same names import from here. The maths
lives in modules named after what they hold:

* :mod:`areal_m2po.utils.losses`: PPO/SAPO/critic losses, loss aggregation, the
  token/sequence policy ratio;
* :mod:`areal_m2po.utils.rejection_sampling`: masked/truncated behaviour weights;
* :mod:`areal_m2po.utils.advantages`: reward shaping, overlong penalty, KL estimators,
  group/token normalisation, GAE;
* :mod:`areal_m2po.utils.logprobs`: chunked label log-probs and entropy;
* :mod:`areal_m2po.utils.reductions`: masked sum/mean/variance;
* :mod:`areal_m2po.utils.m2po`: the M2PO mask and its statistics.

This module defines nothing of its own.
"""

from __future__ import annotations

from areal_m2po.utils.advantages import (
    gae_advantages,
    group_normalize,
    kl_estimate,
    masked_normalize,
    overlong_reward_penalty,
    reward_transform,
)
from areal_m2po.utils.logprobs import gather_logprobs_entropy
from areal_m2po.utils.losses import (
    LOSS_AGG_MODES,
    PPOLossSpec,
    agg_loss,
    agg_loss_weight,
    ppo_actor_loss,
    ppo_actor_loss_fn,
    ppo_critic_loss_fn,
    sapo_loss_fn,
)
from areal_m2po.utils.m2po import (
    apply_m2po_masking,
    m2_per_token,
    m2po_keep_mask,
    m2po_stats,
)
from areal_m2po.utils.reductions import masked_mean, masked_sum, masked_var

__all__ = [
    "LOSS_AGG_MODES",
    "PPOLossSpec",
    "agg_loss",
    "agg_loss_weight",
    "apply_m2po_masking",
    "gae_advantages",
    "gather_logprobs_entropy",
    "group_normalize",
    "kl_estimate",
    "m2_per_token",
    "m2po_keep_mask",
    "m2po_stats",
    "masked_mean",
    "masked_normalize",
    "masked_sum",
    "masked_var",
    "overlong_reward_penalty",
    "ppo_actor_loss",
    "ppo_actor_loss_fn",
    "ppo_critic_loss_fn",
    "reward_transform",
    "sapo_loss_fn",
]
