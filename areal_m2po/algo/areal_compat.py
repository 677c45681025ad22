"""AReaL's names and calling conventions for this package's maths: the one compatibility place.

Code ported from AReaL keeps its calls: ``ppo_actor_loss_fn`` (the loss options as keywords,
AReaL's argument names ``logprobs`` / ``proximal_logprobs`` / ``old_logprobs``),
``sapo_loss_fn`` (``old_logprobs`` there is the proximal policy, as in AReaL),
``ppo_critic_loss_fn``, and the M2PO helpers ``_apply_m2po_masking`` and
``_get_m2po_loss_mask`` (importable from :mod:`areal_m2po.trainer.ppo.actor` too, where AReaL
defines them). Each is a thin call into the module that owns the concept; new code calls those
directly (:func:`~areal_m2po.algo.ppo_loss.ppo_actor_loss`,
:func:`~areal_m2po.algo.sapo_loss.sapo_loss`,
:func:`~areal_m2po.algo.critic_loss.ppo_critic_loss`, :func:`~areal_m2po.algo.m2po.m2po_mask`).
The module imports only torch and :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from areal_m2po.algo import m2po
from areal_m2po.algo.critic_loss import ppo_critic_loss
from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss
from areal_m2po.algo.rejection_sampling import RejectionSampling
from areal_m2po.algo.sapo_loss import sapo_loss

__all__ = [
    "_apply_m2po_masking",
    "_get_m2po_loss_mask",
    "ppo_actor_loss_fn",
    "ppo_critic_loss_fn",
    "sapo_loss_fn",
]

LossStats = dict[str, torch.Tensor]


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, LossStats]:
    """AReaL's ``ppo_actor_loss_fn``: :func:`~areal_m2po.algo.ppo_loss.ppo_actor_loss` with the
    loss options as keywords.

    ``logprobs`` current, ``proximal_logprobs`` proximal, ``old_logprobs`` behaviour log-probs,
    all float ``[B, T]``; ``options`` are the other fields of :class:`PPOLossSpec`
    (``eps_clip_higher``, ``c_clip``, ``rejection_sampling``, ``importance_sampling_level``,
    ``loss_agg_mode``, ``max_tokens_norm``); an unknown keyword raises ``TypeError``.
    ``rejection_sampling`` may also be a config section, as AReaL passes it (an object with
    :class:`RejectionSampling`'s field names; fields it lacks take the loss's defaults). Builds
    the spec on each call; a training loop builds it once and calls ``ppo_actor_loss``.
    """
    rs = options.get("rejection_sampling")
    if rs is not None and not isinstance(rs, (Mapping, RejectionSampling)):
        # AReaL passes its config section: take its fields
        options["rejection_sampling"] = {
            f.name: getattr(rs, f.name) for f in fields(RejectionSampling) if hasattr(rs, f.name)
        }
    spec = PPOLossSpec(eps_clip=eps_clip, **options)
    return ppo_actor_loss(
        logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask, spec, m2po_mask
    )


def sapo_loss_fn(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, LossStats]:
    """AReaL's ``sapo_loss_fn``: :func:`~areal_m2po.algo.sapo_loss.sapo_loss` with
    ``old_logprobs`` the proximal log-probs (the ratio's reference); the other arguments
    (``advantages, tau_pos, tau_neg, loss_mask, m2po_mask, loss_agg_mode, max_tokens_norm``,
    keyword ``importance_sampling_level``) are ``sapo_loss``'s."""
    return sapo_loss(logprobs, old_logprobs, *args, **kwargs)


ppo_critic_loss_fn = ppo_critic_loss
"""AReaL's name of :func:`~areal_m2po.algo.critic_loss.ppo_critic_loss` (same arguments)."""


def _get_m2po_loss_mask(sorted_m2: torch.Tensor, m2_threshold: float) -> torch.Tensor:
    """AReaL's helper: the M2PO keep mask (bool ``[N]``, True = keep) over 1-D m2 values
    already sorted in descending order, i.e. :func:`m2po.m2po_keep_mask` of them.

    Raises:
        ValueError: ``sorted_m2`` is not sorted in descending order (and the errors of
            :func:`m2po.m2po_keep_mask`).
    """
    keep = m2po.m2po_keep_mask(sorted_m2, m2_threshold)
    if bool((sorted_m2[1:] > sorted_m2[:-1]).any()):
        raise ValueError("sorted_m2 must be sorted in descending order")
    return keep


def _apply_m2po_masking(
    old_logp: torch.Tensor,
    prox_logp: torch.Tensor,
    loss_mask: torch.Tensor,
    m2_threshold: float,
) -> torch.Tensor:
    """AReaL's ``_apply_m2po_masking``: the M2PO keep mask (bool ``[B, T]``, False outside
    ``loss_mask``) of one batch, over every valid token: :func:`m2po.m2po_mask` without its
    statistics, with AReaL's name ``old_logp`` for its ``behave_logp`` (the other arguments are
    the same)."""
    return m2po.m2po_mask(old_logp, prox_logp, loss_mask, m2_threshold, stats_dtype=None)[0]
