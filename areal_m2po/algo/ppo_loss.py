"""The clipped PPO policy loss: decoupled (behaviour weight), dual clip, GSPO, rejection
sampling, M2PO-masked.

Owns :class:`PPOLossSpec` (the loss options, checked once) and :func:`ppo_actor_loss` (the
loss of one micro-batch). The three log-probs of a generated token are named as everywhere in
the package: ``behave_logp`` (behaviour, recorded while sampling), ``prox_logp`` (proximal, the
ratio's reference) and ``logp`` (current, differentiable).

Conventions: per-token tensors are padded 2-D ``[B, T]``; ``loss_mask`` is ``torch.bool``
``[B, T]``, True on valid tokens; log-probs are in nats and arbitrary at masked positions. The
loss returns ``(loss, stats)``: a 0-dim tensor and detached 0-dim float32 statistics, each a
MEAN over the micro-batch's valid tokens unless the name says otherwise (``*_max``, ``*_min``).
Denominators follow :mod:`areal_m2po.algo.aggregation`.

The module imports only torch and the other modules of :mod:`areal_m2po.algo`; it takes no
config object (the actor unpacks its section into :class:`PPOLossSpec`) and keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.algo.aggregation import agg_loss, check_loss_inputs
from areal_m2po.algo.checks import check_choice, check_real
from areal_m2po.algo.options import IMPORTANCE_SAMPLING_LEVELS, LOSS_AGG_MODES
from areal_m2po.algo.policy_ratio import policy_ratio
from areal_m2po.algo.reductions import compute_dtype, masked_sum, stat_scalar
from areal_m2po.algo.rejection_sampling import (
    RejectionSampling,
    as_rejection_sampling,
    behaviour_weight,
)

__all__ = [
    "PPOLossSpec",
    "PolicyLossTerms",
    "WeightedInputs",
    "aggregate_policy_loss",
    "build_policy_terms",
    "clipped_pg",
    "clipped_terms",
    "policy_loss_stats",
    "ppo_actor_loss",
    "ppo_token_terms",
    "prepared_inputs",
    "weighted_inputs",
]


@dataclass(frozen=True)
class PPOLossSpec:
    """The options of the clipped PPO loss, checked once: build it once (e.g. with
    ``areal_m2po.trainer.ppo.loss_fn.ppo_loss_spec``) and pass it to :func:`ppo_actor_loss` on every micro-batch.

    Attributes:
        eps_clip: lower clip range (>= 0): the ratio is clipped to
            ``[1 - eps_clip, 1 + eps_clip_higher]``.
        eps_clip_higher: upper clip range (>= 0); None = ``eps_clip``.
        c_clip: dual-clip constant (> 1) for negative advantages; None = off.
        rejection_sampling: None, a :class:`RejectionSampling`, or a mapping of its field
            names (see :func:`as_rejection_sampling`); stored as a ``RejectionSampling``.
        importance_sampling_level: "token" (PPO) or "sequence" (GSPO).
        loss_agg_mode, max_tokens_norm: see :func:`agg_loss`.
    """

    eps_clip: float
    eps_clip_higher: float | None = None
    c_clip: float | None = None
    rejection_sampling: RejectionSampling | Mapping[str, Any] | None = None
    importance_sampling_level: str = "token"
    loss_agg_mode: str = "token-mean"
    max_tokens_norm: int | None = None

    def __post_init__(self) -> None:
        eps_lo = check_real("eps_clip", self.eps_clip)
        if not eps_lo >= 0:
            raise ValueError(f"eps_clip must be >= 0, got {eps_lo}")
        object.__setattr__(self, "eps_clip", eps_lo)
        if self.eps_clip_higher is not None:
            eps_hi = check_real("eps_clip_higher", self.eps_clip_higher)
            if not eps_hi >= 0:
                raise ValueError(f"eps_clip_higher must be >= 0, got {eps_hi}")
            object.__setattr__(self, "eps_clip_higher", eps_hi)
        if self.c_clip is not None:
            cc = check_real("c_clip", self.c_clip)
            if not cc > 1.0:
                raise ValueError(f"c_clip must be > 1, got {cc}")
            object.__setattr__(self, "c_clip", cc)
        check_choice(
            "importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
        )
        check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        rs = as_rejection_sampling(self.rejection_sampling)
        object.__setattr__(self, "rejection_sampling", rs)

    @property
    def eps_clip_upper(self) -> float:
        """The upper clip range: ``eps_clip_higher``, or ``eps_clip`` when that is None."""
        return self.eps_clip if self.eps_clip_higher is None else self.eps_clip_higher


@dataclass(frozen=True)
class PolicyLossTerms:
    """The per-token pieces of a policy-gradient loss on one micro-batch, all ``[B, T]``:
    what :func:`agg_loss` aggregates and what the statistics read.

    Attributes:
        token_loss: float, the token's loss before aggregation (behaviour weight applied);
            carries the gradient. Read only on ``keep`` tokens.
        valid: bool, the ``loss_mask`` (the denominators count these).
        keep: bool, the numerator tokens: valid, kept by M2PO and by rejection sampling.
        ratio: float (detached), the policy ratio the token's loss uses (GSPO: its row's
            sequence ratio); 1 outside ``valid``.
        advantages: float (detached), the advantage the token's loss uses (GSPO: its row's
            mean over kept tokens); 0 outside ``valid``.
        clip_active, dual_active: bool, tokens on the clipped / dual-clip branch (CISPO:
            ``clip_active`` marks ratios outside the clip band; no dual clip).
        behave_weight: float (detached), ``w = pi_prox / pi_behave`` (bounded by rejection
            sampling on the candidate tokens, raw elsewhere in ``valid``).
        rejected: bool, the candidate tokens rejection sampling dropped or whose weight it
            clamped.
        approx_kl: float (detached), ``prox_logp - logp``.
        behave_approx_kl: float (detached), ``behave_logp - prox_logp``.
    """

    token_loss: torch.Tensor
    valid: torch.Tensor
    keep: torch.Tensor
    ratio: torch.Tensor
    advantages: torch.Tensor
    clip_active: torch.Tensor
    dual_active: torch.Tensor
    behave_weight: torch.Tensor
    rejected: torch.Tensor
    approx_kl: torch.Tensor
    behave_approx_kl: torch.Tensor


def clipped_pg(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_higher: float,
    c_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (dual-)clipped policy-gradient loss of every element, elementwise on any shape.

    ``pg = max(-A r, -A clamp(r, 1 - eps_clip, 1 + eps_clip_higher))``; with ``c_clip``,
    elements with ``A < 0`` get ``min(pg, -A c_clip)``. Returns ``(pg, clip_active,
    dual_active)``: the loss and the bool elements on the clipped / dual-clip branch.
    """
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_higher)
    clip_active = pg2.detach() > pg1.detach()
    pg = torch.maximum(pg1, pg2)
    if c_clip is None:
        return pg, clip_active, torch.zeros_like(clip_active)
    pg3 = -advantages * float(c_clip)
    dual_active = (advantages < 0) & (pg3 < pg.detach())
    return torch.where(dual_active, pg3, pg), clip_active, dual_active


@torch.no_grad()
def policy_loss_stats(loss: torch.Tensor, terms: PolicyLossTerms) -> dict[str, torch.Tensor]:
    """The reduced statistics of a policy loss (detached 0-dim float32; means over the valid
    tokens unless the name says otherwise): ``actor/clip_fraction``,
    ``actor/dual_clip_fraction`` (kept tokens on that branch, over valid tokens),
    ``actor/importance_weight`` (+ ``_max``, ``_min``), ``actor/approx_kl`` (proximal -
    current), ``actor/behave_imp_weight`` (+ ``_max``), ``actor/behave_approx_kl`` (behave -
    proximal), ``actor/rejected_fraction`` (valid tokens rejected, or whose weight was
    clamped), ``actor/pg_loss``."""
    dev = loss.device
    valid = terms.valid
    n_valid = valid.sum().clamp(min=1)
    has_valid = valid.any()  # a tensor: no host sync per micro-batch

    def _mean(x: torch.Tensor) -> torch.Tensor:
        return stat_scalar(masked_sum(x.to(torch.float64), valid) / n_valid, dev)

    def _ext(x: torch.Tensor, fn: str) -> torch.Tensor:
        """max/min of ``x`` over the valid tokens (0 without one): the others filled with the
        extremum's identity, so the shape stays fixed and nothing is read on the host."""
        fill = float("-inf") if fn == "max" else float("inf")
        ext = getattr(x.masked_fill(~valid, fill), fn)()
        return stat_scalar(torch.where(has_valid, ext, torch.zeros_like(ext)), dev)

    def _frac(m: torch.Tensor) -> torch.Tensor:
        return stat_scalar(m.sum() / n_valid, dev)

    r, w = terms.ratio, terms.behave_weight
    return {
        "actor/clip_fraction": _frac(terms.clip_active & terms.keep),
        "actor/dual_clip_fraction": _frac(terms.dual_active & terms.keep),
        "actor/importance_weight": _mean(r),
        "actor/importance_weight_max": _ext(r, "max"),
        "actor/importance_weight_min": _ext(r, "min"),
        "actor/approx_kl": _mean(terms.approx_kl),
        "actor/behave_imp_weight": _mean(w),
        "actor/behave_imp_weight_max": _ext(w, "max"),
        "actor/behave_approx_kl": _mean(terms.behave_approx_kl),
        "actor/rejected_fraction": _frac(terms.rejected),
        "actor/pg_loss": stat_scalar(loss, dev),
    }


def prepared_inputs(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checked inputs of a policy loss (one-line TypeError / ValueError otherwise) in its
    compute dtype: ``(lp, prox, behave, adv, valid, cand)``, with ``prox``, ``behave`` and
    ``adv`` detached, ``adv`` 0 outside ``loss_mask``, ``valid`` the ``loss_mask`` and ``cand``
    the valid tokens M2PO kept."""
    check_loss_inputs(
        loss_mask,
        m2po_mask,
        spec.loss_agg_mode,
        logp=logp,
        prox_logp=prox_logp,
        behave_logp=behave_logp,
        advantages=advantages,
    )
    dtype = compute_dtype(logp, prox_logp, behave_logp, advantages)
    valid = loss_mask
    adv = torch.where(valid, advantages.detach().to(dtype), 0.0)
    cand = valid if m2po_mask is None else valid & m2po_mask
    return (
        logp.to(dtype),
        prox_logp.detach().to(dtype),
        behave_logp.detach().to(dtype),
        adv,
        valid,
        cand,
    )


@dataclass(frozen=True)
class WeightedInputs:
    """A policy loss's checked inputs with the behaviour weight, all ``[B, T]`` in the compute
    dtype (:func:`weighted_inputs`): ``lp`` (current log-probs, differentiable), ``prox``,
    ``behave`` and ``adv`` (detached; ``adv`` 0 outside ``valid``), ``valid`` (bool, the
    ``loss_mask``), ``keep`` (bool, valid and kept by M2PO and rejection sampling),
    ``behave_weight`` and ``rejected`` (from :func:`behaviour_weight`)."""

    lp: torch.Tensor
    prox: torch.Tensor
    behave: torch.Tensor
    adv: torch.Tensor
    valid: torch.Tensor
    keep: torch.Tensor
    behave_weight: torch.Tensor
    rejected: torch.Tensor


def weighted_inputs(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None,
) -> WeightedInputs:
    """:func:`prepared_inputs`, then the behaviour weight ``pi_prox / pi_behave`` under
    ``spec.rejection_sampling`` (:func:`behaviour_weight`): the common start of the clipped
    and CISPO losses (the arguments of :func:`ppo_actor_loss`)."""
    lp, prox, behave, adv, valid, cand = prepared_inputs(
        logp, prox_logp, behave_logp, advantages, loss_mask, spec, m2po_mask
    )
    rs = as_rejection_sampling(spec.rejection_sampling)  # already one: returned as it is
    w, keep, affected = behaviour_weight(rs, prox, behave, valid, cand)
    return WeightedInputs(lp, prox, behave, adv, valid, keep, w, affected)


def build_policy_terms(
    x: WeightedInputs,
    *,
    token_loss: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    clip_active: torch.Tensor,
    dual_active: torch.Tensor | None = None,
) -> PolicyLossTerms:
    """The :class:`PolicyLossTerms` of a loss over ``x``: its own ``token_loss`` (behaviour
    weight applied), ``ratio`` (detached), ``advantages``, ``clip_active`` and
    ``dual_active`` (None: no dual clip); the masks, the behaviour weight and the KL terms
    from ``x``."""
    return PolicyLossTerms(
        token_loss=token_loss,
        valid=x.valid,
        keep=x.keep,
        ratio=ratio,
        advantages=advantages,
        clip_active=clip_active,
        dual_active=torch.zeros_like(x.valid) if dual_active is None else dual_active,
        behave_weight=x.behave_weight,
        rejected=x.rejected,
        approx_kl=x.prox - x.lp.detach(),
        behave_approx_kl=x.behave - x.prox,
    )


def aggregate_policy_loss(
    terms: PolicyLossTerms, spec: PPOLossSpec
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``(loss, stats)`` of ``terms``: :func:`agg_loss` of the kept tokens' losses under
    ``spec``'s aggregation, and :func:`policy_loss_stats`."""
    loss = agg_loss(
        terms.token_loss, terms.keep, terms.valid, spec.loss_agg_mode, spec.max_tokens_norm
    )
    return loss, policy_loss_stats(loss, terms)


def clipped_terms(x: WeightedInputs, spec: PPOLossSpec) -> PolicyLossTerms:
    """The clipped PPO loss's per-token terms over ``x`` (see :func:`ppo_actor_loss`)."""
    ratio, adv = policy_ratio(x.lp, x.prox, x.adv, x.valid, x.keep, spec.importance_sampling_level)
    pg, clip_active, dual_active = clipped_pg(
        ratio, adv, spec.eps_clip, spec.eps_clip_upper, spec.c_clip
    )
    return build_policy_terms(
        x,
        token_loss=pg * x.behave_weight,
        ratio=ratio.detach(),
        advantages=adv,
        clip_active=clip_active,
        dual_active=dual_active,
    )


def ppo_token_terms(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None = None,
) -> PolicyLossTerms:
    """The per-token terms of :func:`ppo_actor_loss` (same arguments), before aggregation."""
    x = weighted_inputs(logp, prox_logp, behave_logp, advantages, loss_mask, spec, m2po_mask)
    return clipped_terms(x, spec)


def ppo_actor_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behave_logp: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped (decoupled) PPO policy loss with dual clip, GSPO, rejection sampling and M2PO.

    Per valid token: ``r = exp(logp - prox_logp)`` (or the GSPO sequence ratio,
    see :func:`~areal_m2po.algo.policy_ratio.policy_ratio`), ``pg1 = -A r``, ``pg2 = -A clamp(r, 1 - eps_clip,
    1 + (eps_clip_higher or eps_clip))``, ``loss = max(pg1, pg2)``; with ``c_clip`` tokens with
    ``A < 0`` get ``min(loss, -A c_clip)``. The loss is multiplied by the detached behaviour
    weight ``w = exp(prox_logp - behave_logp)`` (1 when proximal == behaviour: pass
    ``behave_logp=prox_logp`` for AReaL's decoupled loss without rejection sampling,
    which applies no behaviour weight), possibly bounded by ``spec.rejection_sampling``
    ("mask" drops tokens/sequences out of ``[lower, upper]``; "clamp" clamps ``w``).
    Numerator tokens: ``loss_mask & m2po_mask & rejection keep``; denominators from
    ``loss_mask`` (see :func:`agg_loss`).

    Args:
        logp: float ``[B, T]`` current policy log-probs (differentiable).
        prox_logp: ``[B, T]`` proximal log-probs, the ratio's reference (detached here).
        behave_logp: ``[B, T]`` behaviour log-probs recorded while sampling (detached here).
        advantages: ``[B, T]`` (detached here).
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` or None.
        spec: the loss options (:class:`PPOLossSpec`).
    Returns:
        ``(loss, stats)``; stats (means over valid tokens unless named otherwise):
        ``actor/clip_fraction``, ``actor/dual_clip_fraction`` (kept tokens whose clipped /
        dual-clip branch is active, over valid tokens), ``actor/importance_weight`` (+ ``_max``,
        ``_min``), ``actor/approx_kl`` (proximal - current), ``actor/behave_imp_weight``
        (+ ``_max``), ``actor/behave_approx_kl`` (behave - proximal), ``actor/rejected_fraction``
        (valid tokens rejected, or whose weight was clamped), ``actor/pg_loss``.
    """
    terms = ppo_token_terms(logp, prox_logp, behave_logp, advantages, loss_mask, spec, m2po_mask)
    return aggregate_policy_loss(terms, spec)
