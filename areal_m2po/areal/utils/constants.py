"""AReaL's ``areal.utils.constants`` proximal log-prob method names (areal-project/AReaL
cbff54d6): how decoupled PPO gets its proximal log-probs, and the approximations
``areal.trainer.ppo.actor.compute_prox_logp_approximations`` computes. This trainer's own
choice is ``actor.prox_logp_method`` (``recompute`` or ``loglinear``,
:mod:`areal_m2po.trainer.ppo.plan`)."""

from __future__ import annotations

from enum import Enum

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


class ProxLogpMethod(str, Enum):
    """How decoupled PPO gets the proximal log-probs: a forward pass ("recompute"), the
    log-linear approximation ("loglinear"), a forward pass plus approximation metrics
    ("metrics"), or the training forward's own log-probs ("reuse_train_logp")."""

    RECOMPUTE = "recompute"
    LOGLINEAR = "loglinear"
    METRICS = "metrics"
    REUSE_TRAIN_LOGP = "reuse_train_logp"

    def skips_forward_pass(self) -> bool:
        """Whether the method needs no separate forward pass."""
        return self in (ProxLogpMethod.LOGLINEAR, ProxLogpMethod.REUSE_TRAIN_LOGP)


class ProxApproxMethod(str, Enum):
    """The approximations :func:`compute_prox_logp_approximations` computes."""

    LOGLINEAR = "loglinear"
    LINEAR = "linear"
    ROLLOUT = "rollout"


PROX_LOGP_METHOD_RECOMPUTE = ProxLogpMethod.RECOMPUTE.value
PROX_LOGP_METHOD_LOGLINEAR = ProxLogpMethod.LOGLINEAR.value
PROX_LOGP_METHOD_METRICS = ProxLogpMethod.METRICS.value
PROX_LOGP_METHOD_REUSE_TRAIN_LOGP = ProxLogpMethod.REUSE_TRAIN_LOGP.value
PROX_LOGP_METHODS_ALL = [m.value for m in ProxLogpMethod]
PROX_APPROX_METHOD_LOGLINEAR = ProxApproxMethod.LOGLINEAR.value
PROX_APPROX_METHOD_LINEAR = ProxApproxMethod.LINEAR.value
PROX_APPROX_METHOD_ROLLOUT = ProxApproxMethod.ROLLOUT.value
PROX_APPROX_METHODS_ALL = [m.value for m in ProxApproxMethod]
