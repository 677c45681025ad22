"""AReaL's names and calling conventions for this package's maths: the one compatibility place.

Code ported from AReaL keeps its calls: ``ppo_actor_loss_fn`` (the loss options as keywords,
AReaL's argument names ``logprobs`` / ``proximal_logprobs`` / ``old_logprobs``),
``sapo_loss_fn`` (``old_logprobs`` there is the proximal policy, as in AReaL),
``ppo_critic_loss_fn``, AReaL's DPO functions ``dpo_pair_logratios`` (its packed layout) and
``dpo_preference_loss``, and the M2PO helpers ``_apply_m2po_masking`` and
``_get_m2po_loss_mask`` (importable from :mod:`areal_m2po.trainer.ppo.actor` too, where AReaL
defines them). Each is a thin call into the module that owns the concept; new code calls those
directly (:func:`~areal_m2po.algo.ppo_loss.ppo_actor_loss`,
:func:`~areal_m2po.algo.sapo_loss.sapo_loss`,
:func:`~areal_m2po.algo.critic_loss.ppo_critic_loss`, :func:`~areal_m2po.algo.m2po.m2po_mask`,
:mod:`~areal_m2po.algo.dpo`).
The module imports only torch and :mod:`areal_m2po.algo`; it keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

import torch

from areal_m2po.algo import dpo, m2po
from areal_m2po.algo.critic_loss import ppo_critic_loss
from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss
from areal_m2po.algo.rejection_sampling import RejectionSampling
from areal_m2po.algo.sapo_loss import sapo_loss

__all__ = [
    "_apply_m2po_masking",
    "_get_m2po_loss_mask",
    "dpo_pair_logratios",
    "dpo_preference_loss",
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


def dpo_pair_logratios(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    cu_seqlens: torch.Tensor,
    loss_mask: torch.Tensor,
    valid_pairs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AReaL's ``dpo_pair_logratios`` on its packed layout: each sequence's summed
    completion log-probs under the policy and the reference, and its completion tokens, in
    pairs (:func:`~areal_m2po.algo.dpo.dpo_pair_logratios` on the padded layout).

    Args:
        logprobs, ref_logprobs: float ``[N]``, the sequences packed one after the other,
            interleaved ``[chosen_0, rejected_0, chosen_1, ...]``; position ``t`` holds the
            log-prob of token ``t + 1`` (next-token layout).
        cu_seqlens: int ``[2P + 1]`` sequence boundaries in the packed tensors.
        loss_mask: bool ``[N]``, True on the completion tokens (token layout: it is shifted
            by one to meet the log-probs, and each sequence's last position is dropped).
        valid_pairs: bool ``[P]``, the pairs to keep (e.g. not padding).

    Returns:
        ``(policy_logps, ref_logps, completion_lens)``, float64 ``[K, 2]`` each (``K`` valid
        pairs; column 0 chosen, column 1 rejected).
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    shifted = torch.zeros_like(loss_mask, dtype=torch.bool)
    shifted[:-1] = loss_mask[1:].bool()
    keep = valid_pairs.bool().repeat_interleave(2).tolist()

    def rows(x: torch.Tensor) -> torch.Tensor:
        # the valid sequences, one per row, right-padded; a sequence's last position predicts
        # nothing, so it is left out
        parts = [p[:-1] for p, k in zip(torch.split(x, lengths), keep) if k]
        if not parts:
            return x.new_zeros(0, 1)
        return torch.nn.utils.rnn.pad_sequence(parts, batch_first=True)

    mask = rows(shifted)
    if mask.shape[0] == 0:
        empty = torch.zeros(0, 2, dtype=torch.float64, device=logprobs.device)
        return empty, empty.clone(), empty.clone()
    lens = mask.sum(-1).double().view(-1, 2)
    policy = torch.where(mask, rows(logprobs).double(), 0.0).sum(-1).view(-1, 2)
    ref = torch.where(mask, rows(ref_logprobs).double(), 0.0).sum(-1).view(-1, 2)
    return policy, ref, lens


def dpo_preference_loss(
    logits: torch.Tensor, *, beta: float, loss_type: str = "sigmoid"
) -> torch.Tensor:
    """AReaL's ``dpo_preference_loss``: :func:`~areal_m2po.algo.dpo.dpo_preference_loss`
    without label smoothing (``logits`` per token for ``ipo``), float32 ``[P]``."""
    return dpo.dpo_preference_loss(logits.float(), beta=beta, loss_type=loss_type)
