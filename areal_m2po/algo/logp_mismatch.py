"""The training-inference mismatch: how far the rollout engine's behaviour log-probs are from
the trainer's own log-probs of the same tokens under the same weights.

An inference engine (vLLM, SGLang) samples with its own kernels, so even at equal weights its
log-prob of a sampled token differs from the trainer's forward pass. Over tokens whose
behaviour version equals the version of the trainer's log-probs (so staleness plays no part),
with ``d = behave_logp - trainer_logp`` (nats):

* ``abs_mean`` = mean |d|, ``abs_max`` = max |d|;
* ``kl`` = mean of Schulman's k3, ``exp(-d) - 1 + d`` (:func:`~areal_m2po.algo.kl.kl_estimate`),
  an unbiased, never negative estimate of KL(pi_behave || pi_trainer) per token from tokens
  sampled from pi_behave;
* ``tokens``: how many tokens the figures are over.

:func:`mismatch_partials` gives per-rank sums a caller can all-reduce (sum the first, max the
second) and :func:`mismatch_stats` turns them into the figures. Pure torch maths, no state.
"""

from __future__ import annotations

import torch

from areal_m2po.algo.checks import check_bool_mask, check_same_shape, check_tensor
from areal_m2po.algo.kl import kl_estimate

__all__ = ["MISMATCH_KEYS", "mismatch_partials", "mismatch_stats"]

MISMATCH_KEYS = ("abs_mean", "abs_max", "kl", "tokens")
"""The figures :func:`mismatch_stats` returns, in order."""


def mismatch_partials(
    behave_logp: torch.Tensor, trainer_logp: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-rank partial figures over the tokens of ``mask``.

    Args:
        behave_logp: the engine's log-probs of the sampled tokens, float ``[B, T]``.
        trainer_logp: the trainer's log-probs of the same tokens at the same version, float
            ``[B, T]``.
        mask: bool ``[B, T]``, the tokens to compare (valid and at equal version).
    Returns:
        ``(sums, maxes)``, float64: ``sums = [sum |d|, sum k3, n_tokens]`` (all-reduce with a
        sum), ``maxes = [max |d|]`` (all-reduce with a max; 0 without tokens).
    """
    check_tensor("behave_logp", behave_logp, floating=True)
    check_tensor("trainer_logp", trainer_logp, floating=True)
    check_bool_mask("mask", mask)
    check_same_shape("behave_logp", behave_logp, trainer_logp=trainer_logp, mask=mask)
    behave = behave_logp.detach().double()[mask]
    trainer = trainer_logp.detach().double()[mask]
    gap = (behave - trainer).abs()
    k3 = kl_estimate(behave, trainer, "k3")
    count = torch.tensor(float(gap.numel()), dtype=torch.float64, device=gap.device)
    sums = torch.stack([gap.sum(), k3.sum(), count])
    top = gap.max() if gap.numel() else gap.new_zeros(())
    return sums, top.reshape(1)


def mismatch_stats(sums: torch.Tensor, maxes: torch.Tensor) -> dict[str, float]:
    """The figures of (all-reduced) :func:`mismatch_partials`: ``{abs_mean, abs_max, kl,
    tokens}``; empty when there is no token to compare."""
    n = float(sums[2])
    if n == 0:
        return {}
    return {
        "abs_mean": float(sums[0]) / n,
        "abs_max": float(maxes[0]),
        "kl": float(sums[1]) / n,
        "tokens": n,
    }
