"""AReaL's ``areal.utils.constants`` proximal log-prob method names (areal-project/AReaL
cbff54d6; :mod:`areal_m2po.algo.areal_trainer_maths`)."""

from areal_m2po.algo.areal_trainer_maths import (
    PROX_APPROX_METHOD_LINEAR,
    PROX_APPROX_METHOD_LOGLINEAR,
    PROX_APPROX_METHOD_ROLLOUT,
    PROX_APPROX_METHODS_ALL,
    PROX_LOGP_METHOD_LOGLINEAR,
    PROX_LOGP_METHOD_METRICS,
    PROX_LOGP_METHOD_RECOMPUTE,
    PROX_LOGP_METHOD_REUSE_TRAIN_LOGP,
    PROX_LOGP_METHODS_ALL,
    ProxApproxMethod,
    ProxLogpMethod,
)

__all__ = [
    "PROX_APPROX_METHODS_ALL",
    "PROX_APPROX_METHOD_LINEAR",
    "PROX_APPROX_METHOD_LOGLINEAR",
    "PROX_APPROX_METHOD_ROLLOUT",
    "PROX_LOGP_METHODS_ALL",
    "PROX_LOGP_METHOD_LOGLINEAR",
    "PROX_LOGP_METHOD_METRICS",
    "PROX_LOGP_METHOD_RECOMPUTE",
    "PROX_LOGP_METHOD_REUSE_TRAIN_LOGP",
    "ProxApproxMethod",
    "ProxLogpMethod",
]
