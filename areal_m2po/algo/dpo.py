"""Pure tensor maths of Direct Preference Optimization (DPO, Rafailov et al. 2023) and its IPO
variant (Azar et al. 2023).

A preference pair is a prompt ``x`` with a preferred completion ``y_w`` (chosen) and another
``y_l`` (rejected). DPO trains the policy ``pi`` against a frozen reference ``pi_ref`` (the
start model) through the implicit reward ``r(x, y) = beta * log(pi(y|x) / pi_ref(y|x))``::

    h      = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]
    sigmoid: loss = -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h)
    ipo:     loss = (h_avg - 1 / (2 * beta))^2

``eps`` is ``label_smoothing``: the probability that a pair's label is flipped (conservative
DPO, Mitchell 2023; TRL's ``label_smoothing``), in ``[0, 0.5)``. IPO regresses the
length-normalised log-ratio difference ``h_avg`` (each sequence's log-ratio divided by its
completion tokens, as TRL and AReaL do) to ``1 / (2 beta)`` and has no label smoothing.

Layout: the two rows of pair ``i`` are consecutive, row ``2i`` the chosen and row ``2i + 1`` the
rejected completion. Per-token tensors are ``[2P, T]`` (``P`` pairs), aligned to the token: a
log-prob ``x[b, t]`` is that of token ``t`` of row ``b`` given its prefix, in nats, and
``loss_mask[b, t]`` is True on the completion tokens. Sequence sums are taken in float64 (a
long completion's float32 sum can flip the sign of a small difference). The module imports only
torch and :mod:`areal_m2po.algo.checks`; it keeps no state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from areal_m2po.algo.checks import check_bool_mask, check_same_shape, check_tensor

__all__ = [
    "DPO_LOSS_TYPES",
    "dpo_pair_logratios",
    "dpo_preference_loss",
    "dpo_reward_stats",
    "pair_sequence_logps",
]

DPO_LOSS_TYPES = ("sigmoid", "ipo")
"""The preference losses of :func:`dpo_preference_loss` (TRL's and AReaL's ``loss_type``)."""


def pair_sequence_logps(
    values: torch.Tensor, loss_mask: torch.Tensor, average: bool = False
) -> torch.Tensor:
    """Each row's sum (``average``: mean) of ``values`` over its ``loss_mask`` tokens, as pairs.

    Args:
        values: float ``[2P, T]`` per-token values (log-probs or log-ratios).
        loss_mask: bool ``[2P, T]``, True on the completion tokens; every row needs one.
        average: divide each row's sum by its number of completion tokens (IPO).

    Returns:
        float64 ``[P, 2]``: column 0 the chosen rows (even), column 1 the rejected rows (odd).
    """
    check_tensor("values", values, floating=True)
    check_bool_mask("loss_mask", loss_mask)
    check_same_shape("values", values, loss_mask=loss_mask)
    if values.dim() != 2 or values.shape[0] % 2:
        raise ValueError(
            f"values must be [2P, T] (chosen and rejected rows of P pairs), got shape "
            f"{tuple(values.shape)}"
        )
    counts = loss_mask.sum(-1)
    if bool((counts == 0).any()):
        rows = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"loss_mask rows {rows} have no completion token")
    sums = torch.where(loss_mask, values.double(), 0.0).sum(-1)
    if average:
        sums = sums / counts.double()
    return sums.view(-1, 2)


def dpo_pair_logratios(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    average: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence log-ratios ``log pi(y|x) - log pi_ref(y|x)`` of each pair's two rows.

    Args:
        logp: float ``[2P, T]`` per-token log-probs under the policy (differentiable).
        ref_logp: float ``[2P, T]`` per-token log-probs under the reference.
        loss_mask: bool ``[2P, T]``, True on the completion tokens.
        average: per completion token instead of summed (IPO's length normalisation).

    Returns:
        ``(chosen, rejected)``, float64 ``[P]`` each, in nats (per token with ``average``).
    """
    check_same_shape("logp", logp, ref_logp=ref_logp)
    ratios = pair_sequence_logps(logp - ref_logp.to(logp.dtype), loss_mask, average)
    return ratios[:, 0], ratios[:, 1]


def dpo_preference_loss(
    logits: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
    loss_type: str = "sigmoid",
) -> torch.Tensor:
    """The preference loss of each pair (see the module docstring), ``[P]``, ``logits``' dtype.

    Args:
        logits: float ``[P]``: the chosen log-ratio minus the rejected one (``h``; per token
            for ``ipo``).
        beta: the KL weight of DPO (> 0); IPO's target margin is ``1 / (2 beta)``.
        label_smoothing: ``sigmoid`` only: the assumed probability of a flipped label, in
            ``[0, 0.5)``.
        loss_type: ``sigmoid`` (DPO) or ``ipo``.

    Written with ``logsigmoid``, so it is finite with finite gradients for any finite logits.
    """
    check_tensor("logits", logits, floating=True)
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {list(DPO_LOSS_TYPES)}, got {loss_type!r}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing!r}")
    if loss_type == "ipo":
        if label_smoothing:
            raise ValueError("label_smoothing applies to loss_type 'sigmoid' only, not 'ipo'")
        return (logits - 1.0 / (2.0 * beta)) ** 2
    z = beta * logits
    loss = -F.logsigmoid(z)
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-z)
    return loss


def dpo_reward_stats(
    chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor, beta: float
) -> dict[str, torch.Tensor]:
    """Means over pairs of the implicit rewards ``beta * log-ratio`` (detached 0-dim float64).

    ``chosen_reward``, ``rejected_reward``, ``margin`` (chosen minus rejected) and
    ``accuracy`` (share of pairs whose chosen reward is strictly higher; a tie counts as
    wrong), TRL's ``rewards/chosen``, ``rewards/rejected``, ``rewards/margins`` and
    ``rewards/accuracies``.
    """
    check_same_shape("chosen_logratio", chosen_logratio, rejected_logratio=rejected_logratio)
    chosen = beta * chosen_logratio.detach().double()
    rejected = beta * rejected_logratio.detach().double()
    return {
        "chosen_reward": chosen.mean(),
        "rejected_reward": rejected.mean(),
        "margin": (chosen - rejected).mean(),
        "accuracy": (chosen > rejected).double().mean(),
    }
