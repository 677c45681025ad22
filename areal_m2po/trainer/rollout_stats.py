"""What the trainer measures on a rollout batch before training on it, and dynamic filtering.

Every statistic is over all ranks (each rank holds its share of the batch's prompt groups).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from areal_m2po.api.errors import RunError
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch, select_rows

__all__ = [
    "REWARD_COUNTS",
    "RewardFunctionFailed",
    "check_rewards_usable",
    "filter_groups",
    "rollout_stats",
]

REWARD_COUNTS = ("reward/n_errors", "reward/n_timeouts", "reward/n_invalid")
"""Counters of the reward runner, summed over ranks."""


def rollout_stats(batch: Batch, info: dict[str, float], version: int) -> dict[str, float]:
    """``info`` (the generation's own stats, with :data:`REWARD_COUNTS` per rank) plus the
    batch's reward mean/std, mean generated length (tokens), fraction without EOS, behaviour
    versions (min, max) and staleness (``version`` minus the mean version of its valid tokens),
    over all ranks. ``batch`` holds ``rewards`` ``[B]``, ``loss_mask``/``versions`` ``[B, T]``
    and ``no_eos`` ``[B]``."""
    stats = dict(info)
    rewards = batch["rewards"]
    gen_len = batch["loss_mask"].sum(-1).float()
    local = torch.stack(
        [
            rewards.sum(),
            (rewards**2).sum(),
            gen_len.sum(),
            batch["no_eos"].float().sum(),
            torch.tensor(float(rewards.numel()), device=rewards.device),
            *(torch.tensor(stats.get(k, 0.0), device=rewards.device) for k in REWARD_COUNTS),
        ]
    )
    tot = dist.all_reduce_sum(local.double())
    count = float(tot[4])
    for i, k in enumerate(REWARD_COUNTS):  # summed over ranks
        stats[k] = float(tot[5 + i])
    stats["reward/mean"] = float(tot[0]) / count
    stats["reward/std"] = math.sqrt(max(float(tot[1]) / count - stats["reward/mean"] ** 2, 0.0))
    stats["rollout/gen_len_mean"] = float(tot[2]) / count
    stats["rollout/no_eos_fraction"] = float(tot[3]) / count
    versions = batch["versions"][batch["loss_mask"]]
    stats["actor/version"] = float(version)
    v_tot = dist.all_reduce_sum(
        torch.tensor([float(versions.double().sum()), float(versions.numel())]).double()
    )
    if float(v_tot[1]):
        ext = [-versions.min(), versions.max()] if versions.numel() else [-math.inf] * 2
        v_ext = dist.all_reduce_max(torch.tensor([float(x) for x in ext]).double())
        stats["rollout/version_min"] = -float(v_ext[0])
        stats["rollout/version_max"] = float(v_ext[1])
    stats["rollout/staleness"] = (
        version - float(v_tot[0]) / float(v_tot[1]) if float(v_tot[1]) else 0.0
    )
    return stats


class RewardFunctionFailed(RunError):
    """Every sample of a step failed in the reward function (raised or gave no number)."""


def check_rewards_usable(
    stats: dict[str, float], batch: Batch, reward_path: str, runner: Any
) -> None:
    """Stop the run when the reward function failed on every sample of the batch (over all
    ranks): each call raised or returned no finite number (``reward/n_errors`` plus
    ``reward/n_invalid`` of :func:`rollout_stats`' ``stats`` equal the batch's samples). Calls
    that timed out do not count as failures (a slow function is not a broken one); a batch with
    no verifiable scores at all (a workflow grading on its own) passes.

    Args:
        runner: the :class:`~areal_m2po.reward.runner.RewardRunner`; its ``last_problem``
            names the error in the message.

    Raises:
        RewardFunctionFailed: one line naming ``reward.path`` and the error (exit status 1).
    """
    failed = stats.get("reward/n_errors", 0.0) + stats.get("reward/n_invalid", 0.0)
    n = float(dist.all_reduce_sum(torch.tensor([float(batch["rewards"].numel())]).double())[0])
    if n == 0 or failed < n:
        return
    problem = getattr(runner, "last_problem", None) or "failed"
    n_raised = int(stats.get("reward/n_errors", 0))
    fix = (
        "its first traceback is in the log above"
        if n_raised
        else "it must return a finite int or float"
    )
    raise RewardFunctionFailed(
        f"reward.path={reward_path!r} failed on every sample of the step ({int(n)} of "
        f"{int(n)}: {n_raised} raised, {int(stats.get('reward/n_invalid', 0))} returned no "
        f"finite number); the last: {problem}. Training on it would learn from zeros; fix "
        f"the function ({fix})"
    )


def filter_groups(batch: Batch, group_size: int) -> tuple[Batch, float]:
    """Drop the groups (``group_size`` consecutive rows) whose rewards are all equal, keeping
    the first group if none remains; returns the batch and this rank's dropped fraction."""
    r = batch["rewards"].view(-1, group_size)
    informative = (r.max(-1).values - r.min(-1).values) > 0
    n_groups = informative.numel()
    if bool(informative.all()):
        return batch, 0.0
    keep = torch.nonzero(informative).flatten()
    if keep.numel() == 0:
        keep = torch.tensor([0], device=r.device)
    rows = (keep[:, None] * group_size + torch.arange(group_size, device=r.device)).flatten()
    return select_rows(batch, rows), 1.0 - float(informative.sum()) / n_groups
