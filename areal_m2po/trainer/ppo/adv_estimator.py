"""The advantage-estimator seam: which estimator ``actor.adv_estimator`` names.

A built-in (``grpo``, ``gae``, ``rloo``, ``reinforce_pp``: :mod:`areal_m2po.algo.advantages`)
or a user function ``"package.module:function"`` with the
:data:`~areal_m2po.algo.advantages.AdvantageEstimator` signature, loaded through
:func:`areal_m2po.utils.imports.load_object` (a broken module ends in one ``ConfigError`` line
naming ``actor.adv_estimator``); or a Python object passed as ``PPOActor(...,
adv_estimator=fn)``. Unset, the estimator follows what the run trains with: ``gae`` with a
critic or a KL reward penalty (per-token rewards), else ``grpo``.
"""

from __future__ import annotations

from areal_m2po.algo.advantages import AdvantageEstimator, builtin_estimator
from areal_m2po.api.cli_args import ADV_ESTIMATORS
from areal_m2po.utils.imports import load_object

__all__ = ["default_adv_estimator", "load_adv_estimator"]


def default_adv_estimator(critic: bool, kl_penalty: bool) -> str:
    """The built-in an unset ``actor.adv_estimator`` means: ``gae`` with a critic or a KL reward
    penalty, else ``grpo``."""
    return "gae" if critic or kl_penalty else "grpo"


def load_adv_estimator(spec: str | None, *, critic: bool, kl_penalty: bool) -> AdvantageEstimator:
    """The estimator ``spec`` names (a built-in or ``"module:function"``; None: the default).

    Raises:
        ConfigError: ``actor.adv_estimator``: one line naming the module and where it failed.
    """
    name = default_adv_estimator(critic, kl_penalty) if spec is None else spec
    if name in ADV_ESTIMATORS:
        return builtin_estimator(name)
    fn: AdvantageEstimator = load_object(name, "actor.adv_estimator")
    return fn
