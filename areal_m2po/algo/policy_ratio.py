"""The policy ratio of the policy-gradient losses: per token (PPO) or per sequence (GSPO).

Owns :func:`policy_ratio`, which the clipped PPO loss and the SAPO loss share. Per-token
tensors are ``[B, T]``; log-probs in nats. The module imports only torch and keeps no state.
"""

from __future__ import annotations

import torch

__all__ = ["policy_ratio"]


def policy_ratio(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    keep: torch.Tensor,
    level: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The policy ratio of every token and the advantage it is multiplied with.

    "token": ``r_t = exp(logp_t - prox_logp_t)``, advantages unchanged.

    "sequence" (GSPO, as AReaL computes it): ``r = exp(mean over the row's kept tokens of
    (logp - prox_logp))`` with its full gradient (``d r / d logp_t = r / n_kept``), on every token of the
    row, and each token's advantage replaced by the mean advantage of the row's kept tokens.
    The row's loss is then a function of the sequence ratio alone, so token-level behaviour
    weights ``w_t`` enter the gradient of every token of the row through their mean
    (``d loss / d logp_t`` is proportional to ``A_mean * r * mean_t'(w_t')``).

    Args:
        logp: ``[B, T]`` current log-probs (differentiable); prox_logp: ``[B, T]`` proximal
            log-probs, the ratio's reference (detached).
        advantages: ``[B, T]`` (0 outside ``valid``).
        valid, keep: bool ``[B, T]``; ``keep`` (tokens in the loss numerator) within ``valid``.
    Returns:
        ``(ratio, advantages)``, both ``[B, T]``.
    """
    log_r = torch.where(valid, logp - prox_logp, 0.0)
    if level == "token":
        return torch.exp(log_r), advantages
    if log_r.ndim != 2:
        raise ValueError("importance_sampling_level='sequence' needs [B, T] tensors")
    n_kept = keep.sum(dim=1, keepdim=True).clamp(min=1).to(log_r.dtype)
    seq_log_r = torch.where(keep, log_r, 0.0).sum(dim=1, keepdim=True) / n_kept
    seq_adv = torch.where(keep, advantages, 0.0).sum(dim=1, keepdim=True) / n_kept
    return torch.exp(seq_log_r).expand_as(log_r), seq_adv.expand_as(log_r)
