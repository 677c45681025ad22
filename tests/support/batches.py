"""Small hand-made batches the unit tests share (``tests/support`` is on pytest's pythonpath)."""

from __future__ import annotations

import torch


def prefix_mask(lengths: list[int], width: int) -> torch.Tensor:
    """bool ``[len(lengths), width]``: row ``i`` True on its first ``lengths[i]`` positions."""
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        mask[i, :n] = True
    return mask


def reward_batch(
    rewards: list[float], lengths: list[int], width: int, no_eos: list[bool] | None = None
) -> dict[str, torch.Tensor]:
    """What ``PPOActor.compute_advantages`` reads of a rollout: ``loss_mask`` (the first
    ``lengths[i]`` tokens of row ``i``), float32 ``rewards [B]``, bool ``no_eos [B]`` (default
    all False) and zero behaviour / proximal log-probs ``[B, width]``."""
    n = len(rewards)
    return {
        "loss_mask": prefix_mask(lengths, width),
        "rewards": torch.tensor(rewards, dtype=torch.float32),
        "no_eos": torch.tensor(no_eos if no_eos is not None else [False] * n),
        "behave_logp": torch.zeros(n, width),
        "prox_logp": torch.zeros(n, width),
    }
