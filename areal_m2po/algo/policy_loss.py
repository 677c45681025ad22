"""The policy losses as named modes: one registry, one signature.

A mode names a policy loss of one micro-batch (verl calls it ``loss_mode``); every mode is a
:data:`PolicyLossFn`, ``(inputs, options) -> (loss, stats)``, over the same
:class:`PolicyLossInputs` and :class:`PolicyLossOptions`:

* ``ppo_clip``: the clipped PPO loss, ratio against the proximal log-probs;
* ``dual_clip``: the same with ``c_clip`` (a bound on the loss of negative advantages);
* ``decoupled``: the same, weighted by the behaviour weight ``pi_prox / pi_behave`` (possibly
  bounded by rejection sampling);
* ``gspo``: the same with the sequence-level ratio (GSPO);
* ``cispo``: CISPO's clipped, stop-gradient importance weight
  (:mod:`~areal_m2po.algo.cispo_loss`);
* ``sapo``: SAPO's soft gate instead of a clip (:mod:`~areal_m2po.algo.sapo_loss`).

The four clipped modes compute one loss, :func:`~areal_m2po.algo.ppo_loss.ppo_actor_loss`,
whose options (``PolicyLossOptions.ppo``) switch its parts on: a mode names the variant a
config selects (``trainer/ppo/plan.py`` maps the actor's keys onto a mode), and they combine
(a GSPO loss may be decoupled and dual-clipped). Whether the behaviour weight applies is the
caller's choice of ``behave_logp`` (``prox_logp`` for none). A custom loss (``actor.loss_fn``,
mode ``custom`` in :data:`MODES`) replaces the whole micro-batch loss in the trainer and is not
in this registry. Tensor conventions as in :mod:`~areal_m2po.algo.ppo_loss`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from areal_m2po.algo.cispo_loss import cispo_loss
from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss
from areal_m2po.algo.sapo_loss import sapo_loss

__all__ = [
    "CUSTOM",
    "MODES",
    "POLICY_LOSSES",
    "PolicyLossFn",
    "PolicyLossInputs",
    "PolicyLossOptions",
    "policy_loss",
]


@dataclass(frozen=True)
class PolicyLossInputs:
    """The tensors of one micro-batch, all ``[B, T]``.

    Attributes:
        logp: float, current log-probs (differentiable).
        prox_logp: float, proximal log-probs, the ratio's reference (detached by the loss).
        behave_logp: float, behaviour log-probs (``prox_logp``: no behaviour weight; SAPO
            reads none).
        advantages: float (detached by the loss).
        loss_mask: bool, the valid tokens.
        m2po_mask: bool (True = keep) or None: M2PO off.
    """

    logp: torch.Tensor
    prox_logp: torch.Tensor
    behave_logp: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    m2po_mask: torch.Tensor | None = None


@dataclass(frozen=True)
class PolicyLossOptions:
    """The options of every mode.

    Attributes:
        ppo: the clipped-PPO options (every mode but ``sapo``; it carries the aggregation of
            those modes too).
        loss_agg_mode, max_tokens_norm: ``sapo``'s aggregation (see
            :func:`~areal_m2po.algo.aggregation.agg_loss`).
        sapo_tau_pos, sapo_tau_neg: ``sapo``'s gate temperatures (> 0).
    """

    ppo: PPOLossSpec | None = None
    loss_agg_mode: str = "token-mean"
    max_tokens_norm: int | None = None
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05

    def clipped_spec(self, mode: str) -> PPOLossSpec:
        """:attr:`ppo`; ValueError naming ``mode`` when it is None."""
        if self.ppo is None:
            raise ValueError(f"policy loss {mode!r} needs the clipped-PPO options (ppo=None)")
        return self.ppo


PolicyLossFn = Callable[
    [PolicyLossInputs, PolicyLossOptions], tuple[torch.Tensor, dict[str, torch.Tensor]]
]
"""A policy loss mode: ``(inputs, options) -> (loss, stats)``, ``loss`` a 0-dim tensor to
minimise, ``stats`` detached 0-dim statistics."""


def _clipped(mode: str) -> PolicyLossFn:
    def loss(x: PolicyLossInputs, o: PolicyLossOptions) -> tuple[torch.Tensor, dict]:
        spec = o.clipped_spec(mode)
        return ppo_actor_loss(
            x.logp, x.prox_logp, x.behave_logp, x.advantages, x.loss_mask, spec, x.m2po_mask
        )

    return loss


def _cispo(x: PolicyLossInputs, o: PolicyLossOptions) -> tuple[torch.Tensor, dict]:
    spec = o.clipped_spec("cispo")
    return cispo_loss(
        x.logp, x.prox_logp, x.behave_logp, x.advantages, x.loss_mask, spec, m2po_mask=x.m2po_mask
    )


def _sapo(x: PolicyLossInputs, o: PolicyLossOptions) -> tuple[torch.Tensor, dict]:
    return sapo_loss(
        logp=x.logp,
        prox_logp=x.prox_logp,
        advantages=x.advantages,
        tau_pos=o.sapo_tau_pos,
        tau_neg=o.sapo_tau_neg,
        loss_mask=x.loss_mask,
        m2po_mask=x.m2po_mask,
        loss_agg_mode=o.loss_agg_mode,
        max_tokens_norm=o.max_tokens_norm,
    )


POLICY_LOSSES: Mapping[str, PolicyLossFn] = MappingProxyType(
    {
        "ppo_clip": _clipped("ppo_clip"),
        "dual_clip": _clipped("dual_clip"),
        "decoupled": _clipped("decoupled"),
        "gspo": _clipped("gspo"),
        "cispo": _cispo,
        "sapo": _sapo,
    }
)
"""The library's policy losses by mode (read-only)."""

CUSTOM = "custom"
"""The mode of a user's ``actor.loss_fn`` (called by the trainer instead of a registry mode)."""

MODES = (*POLICY_LOSSES, CUSTOM)
"""Every mode name a plan may print."""


def policy_loss(
    mode: str, inputs: PolicyLossInputs, options: PolicyLossOptions
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of mode ``mode`` (:data:`POLICY_LOSSES`) on ``inputs``.

    Raises:
        ValueError: one line naming an unknown ``mode`` and the known ones.
    """
    fn = POLICY_LOSSES.get(mode)
    if fn is None:
        raise ValueError(f"unknown policy loss mode {mode!r}; known: {', '.join(POLICY_LOSSES)}")
    return fn(inputs, options)
