"""AReaL's ``areal.trainer.dpo.dpo_engine`` loss functions (areal-project/AReaL cbff54d6).
AReaL's ``DPOEngine``/``DPOController`` are its trainer; this package's is ``train_dpo``.

:func:`compute_dpo_loss` takes AReaL's packed pairs (``[chosen_0, rejected_0, ...]`` with
``cu_seqlens``), pairs with an empty sequence left out; the sigmoid loss on
``(pi_c - pi_r) - (ref_c - ref_r)`` of the summed completion log-probs, IPO on the per-token
averages; the mean over the kept pairs (0 when none). The pair sums are
``areal.utils.functional.dpo_pair_logratios`` and the loss
``areal.utils.functional.dpo_preference_loss`` (adapters over :mod:`areal_m2po.algo.dpo`).
AReaL also logs statistics to its stats tracker; here :func:`dpo_pair_stats` gives them.
"""

from __future__ import annotations

from typing import Any

import torch

from areal_m2po.areal.utils.functional.functional import dpo_pair_logratios, dpo_preference_loss

__all__ = ["_dpo_loss_weight", "_dpo_valid_pairs", "compute_dpo_loss", "dpo_pair_stats"]


def _dpo_valid_pairs(x: dict[str, Any]) -> torch.Tensor:
    """bool ``[P]``: the pairs whose two sequences are both non-empty."""
    lengths = x["cu_seqlens"][1:] - x["cu_seqlens"][:-1]
    return lengths.view(-1, 2).ne(0).all(dim=1)


def _dpo_loss_weight(x: dict[str, Any]) -> torch.Tensor:
    """The number of valid pairs (float), AReaL's loss weight of a DPO micro-batch."""
    return _dpo_valid_pairs(x).count_nonzero().float()


def _pair_logratios(logprobs: torch.Tensor, input_: dict[str, Any]) -> Any:
    device = logprobs.device
    valid = _dpo_valid_pairs(input_).to(device=device)
    if not valid.any():
        return None
    return dpo_pair_logratios(
        logprobs,
        input_["ref_logprobs"].to(device),
        input_["cu_seqlens"].to(device=device, dtype=torch.long),
        input_["loss_mask"].bool().to(device=device),
        valid,
    )


def compute_dpo_loss(
    logprobs: torch.Tensor,
    entropy: torch.Tensor | None,
    input_: dict[str, Any],
    *,
    beta: float,
    loss_type: str = "sigmoid",
    vocab_min_logits: torch.Tensor | None = None,
    vocab_max_logits: torch.Tensor | None = None,
    vocab_mean_logits: torch.Tensor | None = None,
    vocab_norm_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """AReaL's DPO loss of one packed micro-batch (see the module docstring).

    Args:
        logprobs: float ``[N]`` next-token log-probs of the packed sequences.
        entropy, vocab_*: taken for AReaL's call signature; unused.
        input_: ``cu_seqlens`` int ``[2P + 1]``, ``loss_mask`` ``[N]`` (completion tokens),
            ``ref_logprobs`` float ``[N]``.
        beta: the DPO temperature.
        loss_type: ``sigmoid`` or ``ipo`` (AReaL's ``dpo_preference_loss`` names).

    Raises:
        KeyError: ``ref_logprobs`` is missing.
    """
    ratios = _pair_logratios(logprobs, input_)
    if ratios is None:
        return torch.zeros((), dtype=torch.float32, device=logprobs.device)
    policy, ref, lens = ratios
    if loss_type == "ipo":
        chosen = (policy[:, 0] - ref[:, 0]) / lens[:, 0].clamp(min=1)
        rejected = (policy[:, 1] - ref[:, 1]) / lens[:, 1].clamp(min=1)
        logits = chosen - rejected
    else:
        logits = (policy[:, 0] - policy[:, 1]) - (ref[:, 0] - ref[:, 1])
    return dpo_preference_loss(logits, beta=beta, loss_type=loss_type).mean()


def dpo_pair_stats(
    logprobs: torch.Tensor, input_: dict[str, Any], beta: float
) -> dict[str, torch.Tensor]:
    """The per-pair statistics AReaL logs with :func:`compute_dpo_loss` (float32 ``[K]``):
    ``chosen_reward``/``rejected_reward`` (``beta`` times the summed log-ratio),
    ``reward_accuracy`` (chosen above rejected) and ``reward_margin``; empty without pairs."""
    ratios = _pair_logratios(logprobs.detach(), input_)
    if ratios is None:
        empty = torch.zeros(0, dtype=torch.float32, device=logprobs.device)
        return dict.fromkeys(
            ("chosen_reward", "rejected_reward", "reward_accuracy", "reward_margin"), empty
        )
    policy, ref, _ = ratios
    chosen = (beta * (policy[:, 0] - ref[:, 0])).float()
    rejected = (beta * (policy[:, 1] - ref[:, 1])).float()
    return {
        "chosen_reward": chosen,
        "rejected_reward": rejected,
        "reward_accuracy": (chosen > rejected).float(),
        "reward_margin": chosen - rejected,
    }
