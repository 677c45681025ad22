"""Policy and value losses: clipped/decoupled PPO (options in :class:`PPOLossSpec`), SAPO, the
clipped critic loss, their aggregation over tokens and sequences, and the token/sequence (GSPO)
policy ratio. Rejection sampling lives in :mod:`areal_m2po.utils.rejection_sampling`.

Conventions: per-token tensors are padded 2-D ``[B, T]`` (``B`` sequences, ``T`` positions)
unless a docstring says otherwise; ``loss_mask`` is a ``torch.bool`` ``[B, T]`` tensor, True on
generated tokens that count ("valid" tokens); log-probs are in nats, aligned to their token, and
arbitrary at masked positions (never read unmasked).

* Losses return ``(loss, stats)``: ``loss`` is a 0-dim tensor; ``stats`` maps names to
  detached 0-dim float32 tensors, each a MEAN over the micro-batch's valid tokens
  (``loss_mask``) unless the name says otherwise (``*_max``, ``*_min``), so callers can
  average them weighted by valid-token counts.
* Loss denominators count the valid tokens of ``loss_mask`` BEFORE M2PO / rejection masking:
  a masked token removes its own gradient without inflating the others' (M2PO paper's
  objective; AReaL instead divides by the kept count inside a micro-batch).

The module imports only torch, the standard library, the config tree
(:mod:`areal_m2po.api.cli_args`: choice lists, ``ActorConfig``) and the other pure-maths
modules of ``areal_m2po.utils``; it keeps no state and has no import-time side effects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.cli_args import (
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_AGG_MODES,
    ActorConfig,
    RejectionSamplingConfig,
)
from areal_m2po.utils.checks import check_bool_mask as _check_bool_mask
from areal_m2po.utils.checks import check_choice as _check_choice
from areal_m2po.utils.checks import check_real as _check_real
from areal_m2po.utils.checks import check_same_shape as _check_same_shape
from areal_m2po.utils.checks import check_tensor as _check_tensor
from areal_m2po.utils.reductions import compute_dtype, masked_sum, stat_scalar
from areal_m2po.utils.rejection_sampling import apply_rejection_sampling, as_rejection_config

__all__ = [
    "LOSS_AGG_MODES",
    "PPOLossSpec",
    "agg_loss",
    "agg_loss_weight",
    "ppo_actor_loss",
    "ppo_actor_loss_fn",
    "ppo_critic_loss_fn",
    "sapo_loss_fn",
]


# --------------------------------------------------------------------------------------
# Loss aggregation
# --------------------------------------------------------------------------------------


def agg_loss_weight(loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """The denominator count of :func:`agg_loss` for a (micro-)batch: what the batch weighs.

    * "token-mean": the number of valid tokens;
    * "seq-mean-token-mean", "seq-mean-token-sum-norm": the number of rows with at least one
      valid token (a row without any is no sample of the loss).

    ``agg_loss`` divides by exactly this count (at least 1), so for any split of a batch into
    blocks of rows, ``sum_blocks agg_loss(block) * weight(block) / weight(batch)`` equals
    ``agg_loss(batch)``: the gradient does not depend on the micro-batch split, nor on leaving
    out rows whose token losses are all zero (e.g. zero advantages) once ``weight(batch)`` was
    counted with them.

    Args:
        loss_mask: bool ``[B, T]`` (``[N]`` allowed for "token-mean").
    Returns:
        int64 0-dim tensor.
    """
    _check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = _check_bool_mask("loss_mask", loss_mask)
    if loss_agg_mode == "token-mean":
        return mask.sum()
    if mask.ndim != 2:
        raise ValueError(
            f"loss_agg_mode {loss_agg_mode!r} needs a [B, T] loss_mask, got {tuple(mask.shape)}"
        )
    return mask.any(dim=1).sum()


def agg_loss(
    token_loss: torch.Tensor,
    keep_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    max_tokens_norm: int | None = None,
) -> torch.Tensor:
    """Aggregate per-token losses: numerator over ``keep_mask``, denominators from ``loss_mask``.

    With ``W = agg_loss_weight(loss_mask, loss_agg_mode)`` (clamped to >= 1):

    * "token-mean": ``sum_kept / W``, W the number of valid tokens.
    * "seq-mean-token-mean": per row ``sum_kept_row / n_valid_row``, summed over the rows and
      divided by W, the number of rows with at least one valid token.
    * "seq-mean-token-sum-norm" (Dr. GRPO): ``sum_kept / (W * max_tokens_norm)``, W the number
      of rows with at least one valid token, ``max_tokens_norm`` defaulting to ``T``.

    Args:
        token_loss: float ``[B, T]`` (``[N]`` allowed for "token-mean"); values outside
            ``keep_mask`` are ignored (NaN-safe).
        keep_mask, loss_mask: bool, same shape; ``keep_mask`` should be a subset of ``loss_mask``.
    Returns:
        0-dim loss tensor (differentiable through ``token_loss``).
    """
    _check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    tl = torch.where(
        keep_mask, token_loss, torch.zeros((), dtype=token_loss.dtype, device=token_loss.device)
    )
    if loss_agg_mode != "token-mean" and token_loss.ndim != 2:
        raise ValueError(
            f"loss_agg_mode {loss_agg_mode!r} needs [B, T] tensors, got {tuple(token_loss.shape)}"
        )
    weight = agg_loss_weight(loss_mask, loss_agg_mode).clamp(min=1).to(tl.dtype)
    if loss_agg_mode == "token-mean":
        return tl.sum() / weight
    if loss_agg_mode == "seq-mean-token-mean":
        n_row = loss_mask.sum(dim=1)
        return (tl.sum(dim=1) / n_row.clamp(min=1).to(tl.dtype)).sum() / weight
    norm = token_loss.shape[1] if max_tokens_norm is None else max_tokens_norm
    if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not norm > 0:
        raise ValueError(f"max_tokens_norm must be a positive number, got {max_tokens_norm!r}")
    return tl.sum() / (weight * float(norm))


# --------------------------------------------------------------------------------------
# Policy / value losses
# --------------------------------------------------------------------------------------


def _policy_ratio(
    lp: torch.Tensor,
    ref: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    keep: torch.Tensor,
    level: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy ratio of every token and the advantage it is multiplied with.

    "token": ``r_t = exp(lp_t - ref_t)``, advantages unchanged.

    "sequence" (GSPO, as AReaL computes it): ``r = exp(mean over the row's kept tokens of
    (lp - ref))`` with its full gradient (``d r / d lp_t = r / n_kept``), on every token of the
    row, and each token's advantage replaced by the mean advantage of the row's kept tokens.
    The row's loss is then a function of the sequence ratio alone, so token-level behaviour
    weights ``w_t`` enter the gradient of every token of the row through their mean
    (``d loss / d lp_t`` is proportional to ``A_mean * r * mean_t'(w_t')``).

    Args:
        lp: ``[B, T]`` current log-probs (differentiable); ref: ``[B, T]`` (detached).
        advantages: ``[B, T]`` (0 outside ``valid``).
        valid, keep: bool ``[B, T]``; ``keep`` (tokens in the loss numerator) within ``valid``.
    Returns:
        ``(ratio, advantages)``, both ``[B, T]``.
    """
    log_r = torch.where(valid, lp - ref, 0.0)
    if level == "token":
        return torch.exp(log_r), advantages
    if log_r.ndim != 2:
        raise ValueError("importance_sampling_level='sequence' needs [B, T] tensors")
    n_kept = keep.sum(dim=1, keepdim=True).clamp(min=1).to(log_r.dtype)
    seq_log_r = torch.where(keep, log_r, 0.0).sum(dim=1, keepdim=True) / n_kept
    seq_adv = torch.where(keep, advantages, 0.0).sum(dim=1, keepdim=True) / n_kept
    return torch.exp(seq_log_r).expand_as(log_r), seq_adv.expand_as(log_r)


def _check_loss_inputs(
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None,
    loss_agg_mode: str,
    **tensors: torch.Tensor,
) -> None:
    _check_bool_mask("loss_mask", loss_mask)
    for name, t in tensors.items():
        _check_tensor(name, t, floating=True)
    if m2po_mask is not None:
        _check_bool_mask("m2po_mask", m2po_mask)
    _check_same_shape("loss_mask", loss_mask, **tensors, m2po_mask=m2po_mask)
    _check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)


@dataclass(frozen=True)
class PPOLossSpec:
    """The options of the clipped PPO loss, checked once: build it once (e.g. with
    :meth:`from_actor_config`) and pass it to :func:`ppo_actor_loss` on every micro-batch.

    Attributes:
        eps_clip: lower clip range (>= 0): the ratio is clipped to
            ``[1 - eps_clip, 1 + eps_clip_higher]``.
        eps_clip_higher: upper clip range (>= 0); None = ``eps_clip``.
        c_clip: dual-clip constant (> 1) for negative advantages; None = off.
        rejection_sampling: None, a :class:`RejectionSamplingConfig`, or a mapping/object with
            its field names (see :func:`as_rejection_config`); stored as the config.
        importance_sampling_level: "token" (PPO) or "sequence" (GSPO).
        loss_agg_mode, max_tokens_norm: see :func:`agg_loss`.
    """

    eps_clip: float
    eps_clip_higher: float | None = None
    c_clip: float | None = None
    rejection_sampling: Any = None
    importance_sampling_level: str = "token"
    loss_agg_mode: str = "token-mean"
    max_tokens_norm: int | None = None

    def __post_init__(self) -> None:
        eps_lo = _check_real("eps_clip", self.eps_clip)
        if not eps_lo >= 0:
            raise ValueError(f"eps_clip must be >= 0, got {eps_lo}")
        object.__setattr__(self, "eps_clip", eps_lo)
        if self.eps_clip_higher is not None:
            eps_hi = _check_real("eps_clip_higher", self.eps_clip_higher)
            if not eps_hi >= 0:
                raise ValueError(f"eps_clip_higher must be >= 0, got {eps_hi}")
            object.__setattr__(self, "eps_clip_higher", eps_hi)
        if self.c_clip is not None:
            cc = _check_real("c_clip", self.c_clip)
            if not cc > 1.0:
                raise ValueError(f"c_clip must be > 1, got {cc}")
            object.__setattr__(self, "c_clip", cc)
        _check_choice(
            "importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
        )
        _check_choice("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        rs = as_rejection_config(self.rejection_sampling)
        object.__setattr__(self, "rejection_sampling", rs)

    @property
    def eps_clip_upper(self) -> float:
        """The upper clip range: ``eps_clip_higher``, or ``eps_clip`` when that is None."""
        return self.eps_clip if self.eps_clip_higher is None else self.eps_clip_higher

    @classmethod
    def from_actor_config(cls, config: ActorConfig, max_tokens_norm: int | None) -> PPOLossSpec:
        """The spec of an actor's loss; rejection sampling only applies with the decoupled loss.

        ``max_tokens_norm`` is the Dr. GRPO normaliser (the generation budget).
        """
        return cls(
            eps_clip=config.eps_clip,
            eps_clip_higher=config.eps_clip_higher,
            c_clip=config.c_clip,
            rejection_sampling=config.rejection_sampling if config.use_decoupled_loss else None,
            importance_sampling_level=config.importance_sampling_level,
            loss_agg_mode=config.loss_agg_mode,
            max_tokens_norm=max_tokens_norm,
        )


def _behaviour_weight(
    rs: RejectionSamplingConfig | None,
    prox: torch.Tensor,
    old: torch.Tensor,
    valid: torch.Tensor,
    cand: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w, keep, affected)``: the behaviour weight ``exp(prox - old)`` (bounded by ``rs``), the
    numerator tokens and the tokens rejected or clamped, all ``[B, T]``. ``cand`` are the valid
    tokens M2PO kept; tokens outside it keep their raw weight (for the statistics)."""
    log_w = torch.where(valid, prox - old, 0.0)
    if rs is None:
        return torch.exp(log_w), cand, torch.zeros_like(valid)
    keep_rs, w, affected = apply_rejection_sampling(
        rs, torch.where(cand, log_w, 0.0), cand, prox, old
    )
    return torch.where(cand, w, torch.exp(log_w)), cand & keep_rs, affected


def _clipped_pg(
    ratio: torch.Tensor, adv: torch.Tensor, spec: PPOLossSpec
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pg, clip_active, dual_active)``: the clipped (dual-clipped) token policy loss and the
    bool ``[B, T]`` tokens on its clipped / dual-clip branch."""
    pg1 = -adv * ratio
    pg2 = -adv * ratio.clamp(1.0 - spec.eps_clip, 1.0 + spec.eps_clip_upper)
    clip_active = pg2.detach() > pg1.detach()
    pg = torch.maximum(pg1, pg2)
    if spec.c_clip is None:
        return pg, clip_active, torch.zeros_like(clip_active)
    pg3 = -adv * float(spec.c_clip)
    dual_active = (adv < 0) & (pg3 < pg.detach())
    return torch.where(dual_active, pg3, pg), clip_active, dual_active


@torch.no_grad()
def _ppo_stats(
    loss: torch.Tensor,
    valid: torch.Tensor,
    fractions: dict[str, torch.Tensor],
    ratio: torch.Tensor,
    w: torch.Tensor,
    approx_kl: tuple[torch.Tensor, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The loss statistics: ``fractions`` (bool ``[B, T]`` masks) and ``approx_kl`` (``[B, T]``
    proximal - current and behaviour - proximal) are averaged over the valid tokens."""
    dev = loss.device
    n_valid = valid.sum().clamp(min=1)
    r = ratio.detach()
    has_valid = bool(valid.any())

    def _mean(x: torch.Tensor) -> torch.Tensor:
        return stat_scalar(masked_sum(x.to(torch.float64), valid) / n_valid, dev)

    def _ext(x: torch.Tensor, fn: str) -> torch.Tensor:
        if not has_valid:
            return stat_scalar(0.0, dev)
        return stat_scalar(getattr(x[valid], fn)(), dev)

    frac = {k: stat_scalar(m.sum() / n_valid, dev) for k, m in fractions.items()}
    return {
        "actor/clip_fraction": frac["actor/clip_fraction"],
        "actor/dual_clip_fraction": frac["actor/dual_clip_fraction"],
        "actor/importance_weight": _mean(r),
        "actor/importance_weight_max": _ext(r, "max"),
        "actor/importance_weight_min": _ext(r, "min"),
        "actor/approx_kl": _mean(approx_kl[0]),
        "actor/behave_imp_weight": _mean(w),
        "actor/behave_imp_weight_max": _ext(w, "max"),
        "actor/behave_approx_kl": _mean(approx_kl[1]),
        "actor/rejected_fraction": frac["actor/rejected_fraction"],
        "actor/pg_loss": stat_scalar(loss, dev),
    }


def ppo_actor_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    spec: PPOLossSpec,
    m2po_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped (decoupled) PPO policy loss with dual clip, GSPO, rejection sampling and M2PO.

    Per valid token: ``r = exp(logprobs - proximal_logprobs)`` (or the GSPO sequence ratio,
    see :func:`_policy_ratio`), ``pg1 = -A r``, ``pg2 = -A clamp(r, 1 - eps_clip,
    1 + (eps_clip_higher or eps_clip))``, ``loss = max(pg1, pg2)``; with ``c_clip`` tokens with
    ``A < 0`` get ``min(loss, -A c_clip)``. The loss is multiplied by the detached behaviour
    weight ``w = exp(proximal_logprobs - old_logprobs)`` (1 when proximal == old: pass
    ``old_logprobs=proximal_logprobs`` for AReaL's decoupled loss without rejection sampling,
    which applies no behaviour weight), possibly bounded by ``spec.rejection_sampling``
    ("mask" drops tokens/sequences out of ``[lower, upper]``; "clamp" clamps ``w``).
    Numerator tokens: ``loss_mask & m2po_mask & rejection keep``; denominators from
    ``loss_mask`` (see :func:`agg_loss`).

    Args:
        logprobs: float ``[B, T]`` current policy log-probs (differentiable).
        proximal_logprobs: ``[B, T]`` policy at step start (ratio reference; detached here).
        old_logprobs: ``[B, T]`` behaviour log-probs from generation (detached here).
        advantages: ``[B, T]`` (detached here).
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` or None.
        spec: the loss options (:class:`PPOLossSpec`).
    Returns:
        ``(loss, stats)``; stats (means over valid tokens unless named otherwise):
        ``actor/clip_fraction``, ``actor/dual_clip_fraction`` (kept tokens whose clipped /
        dual-clip branch is active, over valid tokens), ``actor/importance_weight`` (+ ``_max``,
        ``_min``), ``actor/approx_kl`` (proximal - current), ``actor/behave_imp_weight``
        (+ ``_max``), ``actor/behave_approx_kl`` (old - proximal), ``actor/rejected_fraction``
        (valid tokens rejected, or whose weight was clamped), ``actor/pg_loss``.
    """
    _check_loss_inputs(
        loss_mask,
        m2po_mask,
        spec.loss_agg_mode,
        logprobs=logprobs,
        proximal_logprobs=proximal_logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
    )
    dtype = compute_dtype(logprobs, proximal_logprobs, old_logprobs, advantages)
    valid = loss_mask
    lp = logprobs.to(dtype)
    prox = proximal_logprobs.detach().to(dtype)
    old = old_logprobs.detach().to(dtype)
    adv = torch.where(valid, advantages.detach().to(dtype), 0.0)
    cand = valid if m2po_mask is None else valid & m2po_mask
    w, keep, affected = _behaviour_weight(spec.rejection_sampling, prox, old, valid, cand)
    ratio, adv = _policy_ratio(lp, prox, adv, valid, keep, spec.importance_sampling_level)
    pg, clip_active, dual_active = _clipped_pg(ratio, adv, spec)
    loss = agg_loss(pg * w, keep, valid, spec.loss_agg_mode, spec.max_tokens_norm)
    fractions = {
        "actor/clip_fraction": clip_active & keep,
        "actor/dual_clip_fraction": dual_active & keep,
        "actor/rejected_fraction": affected,
    }
    kl_terms = (prox - lp.detach(), old - prox)
    return loss, _ppo_stats(loss, valid, fractions, ratio, w, kl_terms)


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """AReaL's calling convention for :func:`ppo_actor_loss`: the loss options as keywords.

    ``options`` are the other fields of :class:`PPOLossSpec` (``eps_clip_higher``, ``c_clip``,
    ``rejection_sampling``, ``importance_sampling_level``, ``loss_agg_mode``,
    ``max_tokens_norm``); an unknown keyword raises ``TypeError``. Builds the spec on each
    call; a training loop builds it once and calls :func:`ppo_actor_loss`.
    """
    spec = PPOLossSpec(eps_clip=eps_clip, **options)
    return ppo_actor_loss(
        logprobs, proximal_logprobs, old_logprobs, advantages, loss_mask, spec, m2po_mask
    )


def sapo_loss_fn(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
    loss_mask: torch.Tensor,
    m2po_mask: torch.Tensor | None = None,
    loss_agg_mode: str = "token-mean",
    max_tokens_norm: int | None = None,
    *,
    importance_sampling_level: str = "token",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO (Soft Adaptive Policy Optimization) loss: a soft sigmoid gate instead of a hard clip.

    With ``r = exp(logprobs - old_logprobs)`` (``old_logprobs`` = the proximal policy, the
    ratio's reference) and ``tau = tau_pos if A > 0 else tau_neg``, the token loss is
    ``-A * (4 / tau) * sigmoid(tau * (r - 1))`` (AReaL's gate). Its gradient is
    ``-A * g * r * grad(logprobs)`` with gate weight ``g = 4 s (1 - s)``,
    ``s = sigmoid(tau (r - 1))``: ``g = 1`` at ``r = 1`` (vanilla policy gradient), decaying
    smoothly off-policy. Same numerator/denominator/aggregation rules as
    :func:`ppo_actor_loss_fn`; ``importance_sampling_level="sequence"`` uses the GSPO ratio.

    Args:
        logprobs: float ``[B, T]`` (differentiable); old_logprobs, advantages: ``[B, T]``.
        tau_pos, tau_neg: gate temperatures (> 0).
        loss_mask: bool ``[B, T]``; m2po_mask: bool ``[B, T]`` or None.
    Returns:
        ``(loss, stats)`` with ``sapo/gate_mean``, ``sapo/gate_min``,
        ``sapo/soft_gate_fraction`` (valid tokens with ``g < 0.5``),
        ``actor/importance_weight``, ``actor/approx_kl`` (old - current), ``actor/pg_loss``.
    """
    _check_loss_inputs(
        loss_mask,
        m2po_mask,
        loss_agg_mode,
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
    )
    tp = _check_real("tau_pos", tau_pos)
    tn = _check_real("tau_neg", tau_neg)
    if not tp > 0:
        raise ValueError(f"tau_pos must be > 0, got {tp}")
    if not tn > 0:
        raise ValueError(f"tau_neg must be > 0, got {tn}")
    _check_choice(
        "importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS
    )
    dtype = compute_dtype(logprobs, old_logprobs, advantages)
    valid = loss_mask
    keep = valid if m2po_mask is None else valid & m2po_mask
    lp = logprobs.to(dtype)
    ref = old_logprobs.detach().to(dtype)
    adv = torch.where(valid, advantages.detach().to(dtype), 0.0)
    ratio, adv = _policy_ratio(lp, ref, adv, valid, keep, importance_sampling_level)
    tau = torch.where(adv > 0, tp, tn).to(dtype)
    s = torch.sigmoid(tau * (ratio - 1.0))
    token_loss = -adv * (4.0 / tau) * s
    loss = agg_loss(token_loss, keep, valid, loss_agg_mode, max_tokens_norm)
    with torch.no_grad():
        dev = logprobs.device
        n_valid = valid.sum().clamp(min=1)
        sd = s.detach()
        gate = 4.0 * sd * (1.0 - sd)
        r = ratio.detach()
        stats = {
            "sapo/gate_mean": stat_scalar(masked_sum(gate, valid) / n_valid, dev),
            "sapo/gate_min": stat_scalar(gate[valid].min() if bool(valid.any()) else 0.0, dev),
            "sapo/soft_gate_fraction": stat_scalar((valid & (gate < 0.5)).sum() / n_valid, dev),
            "actor/importance_weight": stat_scalar(masked_sum(r, valid) / n_valid, dev),
            "actor/approx_kl": stat_scalar(masked_sum(ref - lp.detach(), valid) / n_valid, dev),
            "actor/pg_loss": stat_scalar(loss, dev),
        }
    return loss, stats


def ppo_critic_loss_fn(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, old - eps, old + eps) - R)^2)``.

    Args:
        values: float ``[B, T]`` (differentiable); old_values, returns: ``[B, T]`` (detached).
        value_eps_clip: >= 0, or None for the unclipped ``0.5 (v - R)^2``.
        loss_mask: bool ``[B, T]``.
    Returns:
        ``(loss, stats)`` with ``critic/value_clip_fraction`` (valid tokens where the clipped
        term is the larger), ``critic/value_loss``, ``critic/values_mean``.
    """
    _check_loss_inputs(
        loss_mask, None, loss_agg_mode, values=values, old_values=old_values, returns=returns
    )
    dtype = compute_dtype(values, old_values, returns)
    v = values.to(dtype)
    old = old_values.detach().to(dtype)
    ret = returns.detach().to(dtype)
    l1 = (v - ret) ** 2
    if value_eps_clip is None:
        token_loss = 0.5 * l1
        clip_active = torch.zeros_like(loss_mask)
    else:
        eps = _check_real("value_eps_clip", value_eps_clip)
        if not eps >= 0:
            raise ValueError(f"value_eps_clip must be >= 0, got {eps}")
        v_clip = old + (v - old).clamp(-eps, eps)
        l2 = (v_clip - ret) ** 2
        token_loss = 0.5 * torch.maximum(l1, l2)
        clip_active = l2.detach() > l1.detach()
    loss = agg_loss(token_loss, loss_mask, loss_mask, loss_agg_mode)
    with torch.no_grad():
        dev = values.device
        n_valid = loss_mask.sum().clamp(min=1)
        stats = {
            "critic/value_clip_fraction": stat_scalar(
                (clip_active & loss_mask).sum() / n_valid, dev
            ),
            "critic/value_loss": stat_scalar(loss, dev),
            "critic/values_mean": stat_scalar(masked_sum(v.detach(), loss_mask) / n_valid, dev),
        }
    return loss, stats
