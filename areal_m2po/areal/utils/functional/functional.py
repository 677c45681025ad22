"""AReaL's ``areal.utils.functional`` (areal-project/AReaL cbff54d6,
``areal/utils/functional/functional.py``) with AReaL's contract, computed by this package's
maths; each name is an adapter of layouts, arguments and statistics:

=================================  =====================================================
AReaL                              this package
=================================  =====================================================
``ppo_actor_loss_fn``              :func:`areal_m2po.algo.ppo_loss.ppo_token_terms`
``sapo_loss_fn``                   :func:`areal_m2po.algo.sapo_loss.sapo_token_terms`
``cispo_loss_fn``                  :func:`areal_m2po.algo.cispo_loss.cispo_token_terms`
``ppo_critic_loss_fn``             :func:`areal_m2po.algo.critic_loss.critic_token_terms`
``dpo_pair_logratios``             :func:`areal_m2po.algo.dpo.pair_sequence_logps` (packed)
``dpo_preference_loss``            :func:`areal_m2po.algo.dpo.dpo_preference_loss`
``apply_rejection_sampling``       :func:`areal_m2po.algo.rejection_sampling.apply_rejection_sampling`
``masked_normalization``           :func:`areal_m2po.algo.normalization.normalization_stats`
``compute_binary_kl_divergence``   :func:`areal_m2po.algo.kl.binary_kl`
``reward_overlong_penalty``        :func:`areal_m2po.algo.reward_shaping.overlong_reward_penalty`
=================================  =====================================================

* The losses take AReaL's positional and keyword arguments and return ``(loss, stat)``,
  ``stat`` holding AReaL's keys as PER-TOKEN tensors of the input's shape
  (``importance_weight``, ``approx_kl``, ``clip_mask``, ``dual_clip_mask``, ``loss``; with
  ``rejection_sampling`` also ``behave_imp_weight``, ``behave_approx_kl``, ``behave_mask``
  and the float ``filtered_fraction``; SAPO adds ``sapo_soft_gate``,
  ``sapo_scaled_gate_pos``/``_neg``), which a stats tracker reduces under its own masks.
* Inputs are 2-D padded ``[B, T]`` or 1-D packed ``[N]`` with ``cu_seqlens`` (int ``[B + 1]``,
  :mod:`._layout`); sequence-level importance sampling (GSPO) and sequence-level rejection
  sampling then act per packed sequence. A 1-D input without ``cu_seqlens`` is one sequence
  for token-level options and refused for sequence-level ones, as in AReaL.
* AReaL's semantics: the loss is a token mean over ``loss_mask`` (its count before rejection
  sampling); without ``rejection_sampling`` no behaviour weight is applied (``old_logprobs``
  is then unused); M2PO acts by the caller narrowing ``loss_mask``, so the denominator is the
  kept count. The same checks refuse the same arguments, with messages saying what AReaL's
  say; where AReaL asserts, :class:`ContractError` is both an ``AssertionError`` and a
  ``ValueError``. Some values AReaL lets through are refused (negative clip ranges, non-bool
  masks, mismatched shapes, malformed ``cu_seqlens``).
* The stat tensors equal AReaL's at every position, masked-out ones included.

Keeps no state.
"""

from __future__ import annotations

from typing import Any

import torch

from areal_m2po.algo import dpo
from areal_m2po.algo.aggregation import agg_loss
from areal_m2po.algo.cispo_loss import cispo_token_terms, cispo_weight
from areal_m2po.algo.critic_loss import critic_token_terms
from areal_m2po.algo.options import IMPORTANCE_SAMPLING_LEVELS, VALUE_LOSS_TYPES
from areal_m2po.algo.ppo_loss import PolicyLossTerms, PPOLossSpec, clipped_pg, ppo_token_terms
from areal_m2po.algo.reward_shaping import overlong_reward_penalty
from areal_m2po.algo.sapo_loss import sapo_gate, sapo_token_terms
from areal_m2po.areal.utils._norm import masked_normalization
from areal_m2po.areal.utils.functional._layout import Layout, layout
from areal_m2po.areal.utils.functional.rejection import as_options, rs_layout_message

__all__ = [
    "ContractError",
    "cispo_loss_fn",
    "dpo_pair_logratios",
    "dpo_preference_loss",
    "masked_normalization",
    "ppo_actor_loss_fn",
    "ppo_critic_loss_fn",
    "reward_overlong_penalty",
    "sapo_loss_fn",
]

Stat = dict[str, Any]


class ContractError(ValueError, AssertionError):
    """An argument AReaL refuses with an ``assert``: catchable as AReaL's ``AssertionError``
    and as the ``ValueError`` this package raises for bad arguments."""


# ---------------------------------------------------------------------------------------------
# layouts: padded [B, T] or packed [N] + cu_seqlens <-> the [B, T] rows the maths takes
# ---------------------------------------------------------------------------------------------


_NEED_CU_SEQLENS = (
    "cu_seqlens is required for 1D tensors (packed format) with sequence-level importance "
    "sampling; for a single sequence use cu_seqlens=torch.tensor([0, seq_len], dtype=torch.int32)"
)


# ---------------------------------------------------------------------------------------------
# argument checks with AReaL's messages
# ---------------------------------------------------------------------------------------------


def _check_level(level: Any) -> None:
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"Invalid importance_sampling_level: {level}. Must be 'token' or 'sequence'."
        )


def _float(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return x.detach().to(like.dtype)


# ---------------------------------------------------------------------------------------------
# statistics
# ---------------------------------------------------------------------------------------------


def _count_stats(keep: torch.Tensor, total: int) -> Stat:
    """AReaL's token counts of the loss mask after rejection sampling."""
    n_valid = int(keep.sum())
    return {
        "n_total_tokens": float(total),
        "n_valid_tokens": float(n_valid),
        "n_masked_tokens": float(total - n_valid),
        "masked_token_ratio": float(1.0 - n_valid / max(total, 1)),
    }


def _behave_stats(
    terms: PolicyLossTerms, lay: Layout, prox: torch.Tensor, behave: torch.Tensor
) -> Stat:
    """The rejection-sampling stats: the bounded behaviour weight on the kept tokens (0
    elsewhere), the tokens it is positive on, their ``prox - behave`` and the filtered
    fraction (tokens dropped or clamped, over the loss mask)."""
    keep = lay.to_caller(terms.keep)
    weight = lay.to_caller(torch.where(terms.keep, terms.behave_weight, 0.0))
    mask = (weight > 0) & keep
    kl = torch.where(mask, _float(prox, weight) - _float(behave, weight), 0.0)
    n_valid = max(int(terms.valid.sum()), 1)
    return {
        "behave_imp_weight": weight,
        "behave_approx_kl": kl,
        "behave_mask": mask,
        "filtered_fraction": float(terms.rejected.sum()) / n_valid,
    }


# ---------------------------------------------------------------------------------------------
# the loss functions
# ---------------------------------------------------------------------------------------------


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    rejection_sampling: Any = None,
    importance_sampling_level: str = "token",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stat]:
    """AReaL's clipped (decoupled, dual-clip, GSPO) PPO actor loss.

    Args:
        logprobs: current log-probs (differentiable); proximal_logprobs: the ratio's
            reference; old_logprobs: behaviour log-probs (read only with
            ``rejection_sampling``); advantages. All ``[B, T]``, or ``[N]`` packed.
        eps_clip, eps_clip_higher: the ratio is clipped to ``[1 - eps_clip, 1 +
            (eps_clip_higher or eps_clip)]``; c_clip: dual clip (> 1) or None.
        loss_mask: bool, like ``logprobs``.
        rejection_sampling: None, AReaL's config section, a mapping or a
            :class:`RejectionSampling`: the bounded behaviour weight
            ``pi_prox / pi_behave`` multiplies each token's loss.
        importance_sampling_level: "token" or "sequence" (GSPO: per row or packed sequence).
        cu_seqlens: int ``[B + 1]`` boundaries of 1-D packed inputs.
    Returns:
        ``(loss, stat)``: the token mean over ``loss_mask`` and AReaL's per-token stats.
    """
    _check_level(importance_sampling_level)
    if c_clip is not None and not c_clip > 1.0:
        raise ContractError(f"c_clip must be > 1.0, got {c_clip}")
    rs = as_options(rejection_sampling)
    missing = _NEED_CU_SEQLENS if importance_sampling_level == "sequence" else None
    lay = layout(logprobs, cu_seqlens, missing or rs_layout_message(rs))
    spec = PPOLossSpec(eps_clip, eps_clip_higher, c_clip, rs, importance_sampling_level)
    behave = old_logprobs if rs is not None else proximal_logprobs
    rows = lay.to_rows
    terms = ppo_token_terms(
        rows(logprobs), rows(proximal_logprobs), rows(behave), rows(advantages),
        rows(loss_mask), spec,
    )  # fmt: skip
    loss = agg_loss(terms.token_loss, terms.keep, terms.valid)
    # AReaL's statistics ratio and advantage: token level, the ratio on the loss mask and the
    # given advantages; sequence level, the row's values on the kept tokens, 0 elsewhere
    shown = terms.valid if importance_sampling_level == "token" else terms.keep
    ratio = lay.to_caller(torch.where(shown, terms.ratio, 0.0))
    if importance_sampling_level == "token":
        adv = _float(advantages, ratio)
    else:
        adv = lay.to_caller(torch.where(terms.keep, terms.advantages, 0.0))
    pg, clip, dual = clipped_pg(ratio, adv, spec.eps_clip, spec.eps_clip_upper, c_clip)
    stat: Stat = {
        "loss": pg,
        "importance_weight": ratio,
        "approx_kl": (logprobs - proximal_logprobs).detach(),
        "clip_mask": clip & loss_mask,
        "dual_clip_mask": dual & loss_mask,
        **_count_stats(terms.keep, loss_mask.numel()),
    }
    if rs is not None:
        stat.update(_behave_stats(terms, lay, proximal_logprobs, old_logprobs))
        stat["loss"] = pg * stat["behave_imp_weight"]
    return loss, stat


def sapo_loss_fn(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    loss_mask: torch.Tensor,
    importance_sampling_level: str = "token",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stat]:
    """AReaL's SAPO loss: ``-A * (4 / tau) * sigmoid(tau (r - 1))`` with ``r = exp(logprobs -
    old_logprobs)`` (``old_logprobs`` is the ratio's reference, the proximal policy) and
    ``tau = tau_pos`` for ``A > 0`` else ``tau_neg``; token mean over ``loss_mask``. Shapes and
    ``cu_seqlens`` as :func:`ppo_actor_loss_fn`.

    Returns:
        ``(loss, stat)`` with AReaL's per-token ``loss``, ``importance_weight``,
        ``approx_kl``, ``clip_mask``/``dual_clip_mask`` (all False), ``sapo_soft_gate`` (the
        scaled gate of the token's advantage sign) and ``sapo_scaled_gate_pos``/``_neg``.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError("SAPO temperatures (tau_pos, tau_neg) must be positive.")
    _check_level(importance_sampling_level)
    missing = _NEED_CU_SEQLENS if importance_sampling_level == "sequence" else None
    lay = layout(logprobs, cu_seqlens, missing)
    rows = lay.to_rows
    terms = sapo_token_terms(
        rows(logprobs), rows(old_logprobs), rows(advantages), tau_pos, tau_neg,
        rows(loss_mask), importance_sampling_level=importance_sampling_level,
    )  # fmt: skip
    loss = agg_loss(terms.token_loss, terms.keep, terms.valid)
    log_ratio = (logprobs - old_logprobs).detach()
    if importance_sampling_level == "token":
        ratio = torch.exp(_float(log_ratio, terms.ratio))
        adv = _float(advantages, ratio)
    else:
        ratio = lay.to_caller(torch.where(terms.keep, terms.ratio, 0.0))
        adv = lay.to_caller(torch.where(terms.keep, terms.advantages, 0.0))
    gate_pos, gate_neg = sapo_gate(ratio, tau_pos), sapo_gate(ratio, tau_neg)
    soft_gate = torch.where(adv > 0, gate_pos, gate_neg)
    no_clip = torch.zeros_like(loss_mask, dtype=torch.bool)
    stat: Stat = {
        "loss": -soft_gate * adv,
        "importance_weight": ratio,
        "approx_kl": log_ratio,
        "clip_mask": no_clip,
        "dual_clip_mask": no_clip.clone(),
        "sapo_soft_gate": soft_gate,
        "sapo_scaled_gate_pos": gate_pos,
        "sapo_scaled_gate_neg": gate_neg,
    }
    return loss, stat


def cispo_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    eps_clip_higher: float | None = None,
    old_logprobs: torch.Tensor | None = None,
    rejection_sampling: Any = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Stat]:
    """AReaL's CISPO loss (:mod:`~areal_m2po.algo.cispo_loss`): ``-sg(clamp(r, 1 - eps_clip,
    1 + eps_clip_higher)) * A * logprobs``, token mean over ``loss_mask``; with
    ``rejection_sampling`` the bounded behaviour weight (from ``old_logprobs``) multiplies
    it. Shapes and ``cu_seqlens`` as :func:`ppo_actor_loss_fn` (token level only).

    Returns:
        ``(loss, stat)`` with AReaL's per-token ``loss``, ``importance_weight`` (the
        unclipped ratio), ``approx_kl``, ``clip_mask`` (ratio outside the band, on the loss
        mask after rejection sampling), ``dual_clip_mask`` (all False) and, with
        ``rejection_sampling``, the ``behave_*`` stats and ``filtered_fraction``.
    Raises:
        ValueError: ``eps_clip_higher`` None or not positive; ``rejection_sampling`` without
            ``old_logprobs``.
    """
    rs = as_options(rejection_sampling)
    if rs is not None and old_logprobs is None:
        raise ValueError("old_logprobs is required when rejection_sampling is set")
    spec = PPOLossSpec(eps_clip, eps_clip_higher, None, rs)
    lay = layout(logprobs, cu_seqlens, rs_layout_message(rs))
    behave = old_logprobs if old_logprobs is not None and rs is not None else proximal_logprobs
    rows = lay.to_rows
    terms = cispo_token_terms(
        rows(logprobs), rows(proximal_logprobs), rows(behave), rows(advantages),
        rows(loss_mask), spec,
    )  # fmt: skip
    loss = agg_loss(terms.token_loss, terms.keep, terms.valid)
    log_ratio = (logprobs - proximal_logprobs).detach()
    ratio = torch.exp(_float(log_ratio, terms.ratio))
    clipped = cispo_weight(ratio, spec.eps_clip, spec.eps_clip_upper)
    stat: Stat = {
        "loss": -clipped * _float(advantages, ratio) * _float(logprobs, ratio),
        "importance_weight": ratio,
        "approx_kl": log_ratio,
        "clip_mask": (clipped != ratio) & lay.to_caller(terms.keep),
        "dual_clip_mask": torch.zeros_like(loss_mask, dtype=torch.bool),
    }
    if rs is not None:
        assert old_logprobs is not None  # checked above
        stat.update(_behave_stats(terms, lay, proximal_logprobs, old_logprobs))
        stat["loss"] = stat["loss"] * stat["behave_imp_weight"]
    return loss, stat


def ppo_critic_loss_fn(
    value: torch.Tensor,
    old_value: torch.Tensor,
    target_value: torch.Tensor,
    value_eps_clip: float,
    loss_mask: torch.Tensor | None = None,
    loss_fn_type: str = "mse",
) -> tuple[torch.Tensor, Stat]:
    """AReaL's clipped value loss ``max(err(v, R), err(clip(v, old +- eps), R))``, ``err``
    ``0.5 (v - R)^2`` ("mse") or the Huber loss with delta 10 ("huber"); the mean over
    ``loss_mask`` (over every element without one). Float32 tensors of any one shape.

    Returns:
        ``(loss, stat)``: ``stat`` holds the per-element ``clip_mask`` (the clipped term is
        the larger, on the mask) and ``loss``.
    Raises:
        ContractError: a tensor is not float32 (AReaL asserts it).
        NotImplementedError: an unknown ``loss_fn_type``.
    """
    for name, t in (("value", value), ("old_value", old_value), ("target_value", target_value)):
        if t.dtype != torch.float32:
            raise ContractError(f"{name} must be torch.float32, got {t.dtype}")
    if loss_fn_type not in VALUE_LOSS_TYPES:
        raise NotImplementedError(f"Unknown loss fn type: {loss_fn_type}")
    token_loss, clip = critic_token_terms(
        value, old_value, target_value, value_eps_clip, loss_fn_type
    )
    mask = torch.ones_like(clip) if loss_mask is None else loss_mask.bool()
    loss = agg_loss(token_loss, mask, mask)
    return loss, {"clip_mask": clip & mask, "loss": token_loss.detach()}


def dpo_pair_logratios(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    cu_seqlens: torch.Tensor,
    loss_mask: torch.Tensor,
    valid_pairs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AReaL's ``dpo_pair_logratios`` on its packed layout: each sequence's summed
    completion log-probs under the policy and the reference, and its completion tokens, in
    pairs (:func:`~areal_m2po.algo.dpo.pair_sequence_logps` on the padded layout; a kept
    sequence with no completion token is refused there, where AReaL sums nothing to 0).

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
    policy = dpo.pair_sequence_logps(rows(logprobs), mask)
    return policy, dpo.pair_sequence_logps(rows(ref_logprobs), mask), lens


def dpo_preference_loss(
    logits: torch.Tensor, *, beta: float, loss_type: str = "sigmoid"
) -> torch.Tensor:
    """AReaL's ``dpo_preference_loss``: :func:`~areal_m2po.algo.dpo.dpo_preference_loss`
    without label smoothing (``logits`` per token for ``ipo``), float32 ``[P]``; another
    ``loss_type`` is refused with AReaL's message."""
    if loss_type not in ("sigmoid", "ipo"):
        raise ValueError(f"Unsupported DPO loss_type: {loss_type!r}")
    return dpo.dpo_preference_loss(logits.float(), beta=beta, loss_type=loss_type)


def reward_overlong_penalty(
    data: dict[str, Any],
    overlong_tokens: int,
    overlong_penalty_factor: float,
    max_response_length: int,
) -> dict[str, Any]:
    """``data`` with DAPO's soft overlong penalty
    (:func:`areal_m2po.algo.reward_shaping.overlong_reward_penalty`) added to
    ``data["rewards"]`` ``[B]`` in place, the response length being
    ``data["loss_mask"].sum(-1)``. Unlike AReaL, ``overlong_tokens`` outside ``(0,
    max_response_length]`` and a negative factor are refused (one-line ValueError)."""
    rewards = data["rewards"]
    lengths = data["loss_mask"].sum(dim=-1)
    shaped = overlong_reward_penalty(
        rewards, lengths, overlong_tokens, overlong_penalty_factor, max_response_length
    )
    rewards.copy_(shaped)
    return data
