"""Per-token KL estimators between the policy and a reference policy (Schulman's k1/k2/k3).

Owns :func:`kl_estimate` (the KL reward penalty's and rejection sampling's KL metrics) and
:func:`binary_kl` (rejection sampling's ``binary_kl`` metric, AReaL's KPop).
Per-token tensors are any equal shapes, log-probs in nats. The module imports only torch,
:mod:`areal_m2po.algo.options` and :mod:`areal_m2po.algo.checks`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.checks import check_choice, check_real, check_same_shape, check_tensor
from areal_m2po.algo.options import KL_ESTIMATORS

__all__ = ["binary_kl", "kl_estimate"]


def kl_estimate(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    estimator: str = "k1",
    clamp: float | None = None,
) -> torch.Tensor:
    """Per-token KL estimators (Schulman's k1/k2/k3) of KL(p || ref) from samples of p.

    With ``d = logp - ref_logp`` (nats): k1 = d; k2 = d^2 / 2;
    k3 = exp(-d) - 1 + d (= exp(ref - logp) - 1 - (ref - logp), always >= 0).

    Args:
        logp, ref_logp: float ``[B, T]`` (any equal shapes).
        estimator: "k1" | "k2" | "k3".
        clamp: if set (> 0), each estimate is clamped to ``[-clamp, clamp]`` (AReaL's KL
            reward uses 10).
    Returns:
        ``[B, T]`` tensor of the promoted float dtype.
    """
    check_tensor("logp", logp, floating=True)
    check_tensor("ref_logp", ref_logp, floating=True)
    check_same_shape("logp", logp, ref_logp=ref_logp)
    check_choice("estimator", estimator, KL_ESTIMATORS)
    bound = None
    if clamp is not None:
        bound = check_real("clamp", clamp)
        if not bound > 0:
            raise ValueError(f"clamp must be > 0, got {bound}")
    d = logp - ref_logp
    if estimator == "k1":
        kl = d
    elif estimator == "k2":
        kl = 0.5 * d * d
    else:
        kl = torch.expm1(-d) + d
    return kl if bound is None else kl.clamp(min=-bound, max=bound)


def binary_kl(log_p: torch.Tensor, log_q: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KL(Bernoulli(p) || Bernoulli(q)) per token, ``p = exp(log_p)``, ``q = exp(log_q)``, both
    clamped to ``[eps, 1 - eps]``: ``p log(p/q) + (1-p) log((1-p)/(1-q))`` (nats, >= 0).

    Each token's sampled probability is treated as a coin: the chosen token against all others.
    Args:
        log_p, log_q: float ``[B, T]`` log-probs of the sampled tokens (any equal shapes).
    Returns:
        ``[B, T]`` tensor of the promoted float dtype.
    """
    check_same_shape("log_p", log_p, log_q=log_q)
    p = torch.exp(log_p).clamp(eps, 1.0 - eps)
    q = torch.exp(log_q).clamp(eps, 1.0 - eps)
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))
