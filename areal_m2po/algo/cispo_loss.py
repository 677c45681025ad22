"""The CISPO policy loss (MiniMax-M1, arXiv:2506.13585, Eq. 4-5): the importance weight is
clipped and held constant (stop-gradient), and every token keeps the gradient of its log-prob.

PPO's clip makes a token's loss constant in the parameters once its ratio leaves the clip
band, so those tokens stop learning; CISPO clips the weight instead. Per valid token, with
``r = exp(logp - prox_logp)`` and ``w`` the behaviour weight of the decoupled loss (as in
:func:`~areal_m2po.algo.ppo_loss.ppo_actor_loss`)::

    r_hat      = clamp(r, 1 - eps_clip, 1 + eps_clip_higher)       (no gradient)
    token loss = -r_hat * A * logp * w                             d/d logp = -r_hat * A * w

Advantages are never clipped. MiniMax-M1 sets no lower bound (a large ``eps_low``; here any
``eps_clip >= 1``) and tunes the upper one, so ``eps_clip_higher`` must be given and positive.
Token level only: GSPO's sequence ratio is not part of the surrogate. Aggregation, M2PO and
rejection sampling follow the clipped PPO loss.

Owns :func:`cispo_loss` and its per-token terms (:func:`cispo_token_terms`). The options are a
:class:`~areal_m2po.algo.ppo_loss.PPOLossSpec` (``eps_clip``, ``eps_clip_higher``,
``rejection_sampling``, ``loss_agg_mode``, ``max_tokens_norm``; ``c_clip`` must be None). The
module imports only torch and the other modules of :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.ppo_loss import (
    PolicyLossTerms,
    PPOLossSpec,
    WeightedInputs,
    aggregate_policy_loss,
    build_policy_terms,
    weighted_inputs,
)

__all__ = ["check_cispo_spec", "cispo_loss", "cispo_terms", "cispo_token_terms", "cispo_weight"]


def check_cispo_spec(spec: PPOLossSpec) -> None:
    """One-line ``ValueError`` unless ``spec`` is a CISPO loss: a positive ``eps_clip_higher``,
    no dual clip, token-level importance sampling."""
    hi = spec.eps_clip_higher
    if hi is None or not hi > 0:
        raise ValueError(
            "CISPO requires a positive eps_clip_higher: the upper clip of the importance "
            f"weight is its defining knob (MiniMax-M1 Eq. 4-5); got {hi!r}"
        )
    if spec.c_clip is not None:
        raise ValueError(f"c_clip: CISPO has no dual clip (set None), got {spec.c_clip!r}")
    if spec.importance_sampling_level != "token":
        raise ValueError(
            "CISPO only supports importance_sampling_level='token' (a sequence-level CISPO "
            f"has no published surrogate), got {spec.importance_sampling_level!r}"
        )


def cispo_weight(ratio: torch.Tensor, eps_clip: float, eps_clip_higher: float) -> torch.Tensor:
    """CISPO's importance weight, elementwise and without gradient:
    ``clamp(ratio, 1 - eps_clip, 1 + eps_clip_higher)``."""
    return ratio.detach().clamp(1.0 - eps_clip, 1.0 + eps_clip_higher)


def cispo_token_terms(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None = None,
) -> PolicyLossTerms:
    """The per-token terms of :func:`cispo_loss` (same arguments), before aggregation;
    ``clip_active`` marks the valid tokens whose ratio lies outside the clip band (CISPO
    clips their weight but keeps their gradient)."""
    check_cispo_spec(spec)
    x = weighted_inputs(logp, prox_logp, behave_logp, advantages, loss_mask, spec, m2po_mask)
    return cispo_terms(x, spec)


def cispo_terms(x: WeightedInputs, spec: PPOLossSpec) -> PolicyLossTerms:
    """CISPO's per-token terms over ``x`` (``spec`` checked by :func:`check_cispo_spec`)."""
    ratio = torch.exp(torch.where(x.valid, x.lp.detach() - x.prox, 0.0))
    clipped = cispo_weight(ratio, spec.eps_clip, spec.eps_clip_upper)
    return build_policy_terms(
        x,
        token_loss=-clipped * x.adv * x.behave_weight * x.lp,
        ratio=ratio,
        advantages=x.adv,
        clip_active=x.valid & (clipped != ratio),
    )


def cispo_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The CISPO loss of one micro-batch.

    Args:
        logp: float ``[B, T]`` current policy log-probs (differentiable).
        prox_logp: ``[B, T]`` proximal log-probs, the ratio's reference (detached here).
        behave_logp: ``[B, T]`` behaviour log-probs (detached here); pass ``prox_logp`` for no
            behaviour weight.
        advantages: ``[B, T]`` (detached here).
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` (True = keep) or None.
        spec: the options (:func:`check_cispo_spec` says which are allowed).
    Returns:
        ``(loss, stats)``: the stats of :func:`~areal_m2po.algo.ppo_loss.policy_loss_stats`,
        ``actor/clip_fraction`` being the kept tokens whose ratio left the clip band.
    Raises:
        ValueError, TypeError: one line naming the culprit argument.
    """
    terms = cispo_token_terms(logp, prox_logp, behave_logp, advantages, loss_mask, spec, m2po_mask)
    return aggregate_policy_loss(terms, spec)
