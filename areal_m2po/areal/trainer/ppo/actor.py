"""AReaL's ``areal.trainer.ppo.actor`` pure function :func:`compute_prox_logp_approximations`
(areal-project/AReaL cbff54d6; :mod:`areal_m2po.algo.areal_trainer_maths`). AReaL's
``PPOActor`` is its trainer; this package's is :mod:`areal_m2po.trainer.ppo.actor`."""

from areal_m2po.algo.areal_trainer_maths import compute_prox_logp_approximations

__all__ = ["compute_prox_logp_approximations"]
