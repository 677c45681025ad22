"""AReaL's ``areal.utils.functional`` names (areal-project/AReaL cbff54d6): the losses and
helpers of :mod:`.functional` and :mod:`.rejection`, each an adapter over this package's maths
(the table in :mod:`.functional`). ``gather_logprobs``/``gather_logprobs_entropy``, AReaL's
vocabulary-parallel kernels, are not provided: this trainer has no tensor parallelism."""

from areal_m2po.areal.utils.functional.functional import (
    cispo_loss_fn,
    dpo_pair_logratios,
    dpo_preference_loss,
    masked_normalization,
    ppo_actor_loss_fn,
    ppo_critic_loss_fn,
    reward_overlong_penalty,
    sapo_loss_fn,
)
from areal_m2po.areal.utils.functional.rejection import (
    RejectionSamplingResult,
    apply_rejection_sampling,
    compute_binary_kl_divergence,
)

__all__ = [
    "RejectionSamplingResult",
    "apply_rejection_sampling",
    "cispo_loss_fn",
    "compute_binary_kl_divergence",
    "dpo_pair_logratios",
    "dpo_preference_loss",
    "masked_normalization",
    "ppo_actor_loss_fn",
    "ppo_critic_loss_fn",
    "reward_overlong_penalty",
    "sapo_loss_fn",
]
