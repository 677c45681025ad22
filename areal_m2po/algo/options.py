"""The option values of the maths and the rule for the rejection-sampling options, defined once.

The loss, advantage, KL, normalisation and M2PO modules check their string options against these
tuples, and the config tree (:mod:`areal_m2po.api.cli_args`) offers them as its fields' choices
and checks its rejection-sampling section with :func:`rejection_sampling_problem`. Plain Python
(no torch: loading a config does not import it); no state.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "ADV_ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "M2_TOKEN_SETS",
    "NORM_LEVELS",
    "REJECTION_ACTIONS",
    "REJECTION_AGGS",
    "REJECTION_METRICS",
    "VALUE_LOSS_TYPES",
    "rejection_sampling_problem",
]

NORM_LEVELS = ("batch", "group", None)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")
REJECTION_ACTIONS = ("mask", "clamp")
REJECTION_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")
REJECTION_AGGS = ("mean", "sum", "max")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ADV_ESTIMATORS = ("grpo", "gae", "rloo", "reinforce_pp")
M2_TOKEN_SETS = ("all", "trust_region")
"""M2PO's candidate sets: every valid token, or those in PPO's trust-region quadrants."""
VALUE_LOSS_TYPES = ("mse", "huber")
"""The value loss's error: squared (mse) or Huber."""


def rejection_sampling_problem(
    level: Any, action: Any, metric: Any, agg: Any, upper: Any, lower: Any
) -> tuple[str, str] | None:
    """The first problem of a set of rejection-sampling options as ``(field, message)``, e.g.
    ``("lower", "must be < upper (1.0), got 1.0")``; None when they are valid. The config section
    raises it as a ``ConfigError``, the loss's plain options as a ``ValueError``."""
    named = (("level", level), ("action", action), ("metric", metric), ("agg", agg))
    lists = (IMPORTANCE_SAMPLING_LEVELS, REJECTION_ACTIONS, REJECTION_METRICS, REJECTION_AGGS)
    for (name, value), choices in zip(named, lists, strict=True):
        if value not in choices:
            return name, f"must be one of {list(choices)}, got {value!r}"
    for name, value in (("upper", upper), ("lower", lower)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return name, f"must be a number, got {value!r} ({type(value).__name__})"
        if isinstance(value, float) and not math.isfinite(value):
            return name, f"must be finite, got {value!r}"
    if upper is None and lower is None:
        return "upper", "at least one of upper/lower must be set"
    if upper is not None and lower is not None and lower >= upper:
        return "lower", f"must be < upper ({upper}), got {lower}"
    if metric in ("ratio", "kl_k2", "kl_k3", "binary_kl"):
        # these metrics are never negative: a bound below 0 drops everything or nothing
        if upper is not None and upper <= 0:
            return "upper", f"must be > 0 for metric {metric!r}"
        if lower is not None and lower < 0:
            return "lower", f"must be >= 0 for metric {metric!r}"
    if action == "clamp" and metric != "ratio":
        return "action", "clamp is only defined for metric 'ratio'"
    return None
