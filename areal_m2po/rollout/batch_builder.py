"""The trainer's batch (layout in :mod:`areal_m2po.utils.data`) from trajectory groups.

Every executor builds its batches here, so sync and async mode hand the trainer the same
tensors for the same trajectories.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from areal_m2po.api.workflow_api import TrajectoryGroup
from areal_m2po.utils.data import Batch

__all__ = ["check_groups", "groups_to_batch", "sum_group_stats"]


def check_groups(
    groups: Sequence[TrajectoryGroup],
    n_samples: int,
    workflow: str,
    max_episode_tokens: int | None = None,
) -> None:
    """Raise one line naming ``workflow`` unless every group holds ``n_samples`` trajectories
    of at most ``max_episode_tokens`` tokens each (the episode budget; None: any length), so
    no row of the batch is longer than one episode may be."""
    for g in groups:
        if not isinstance(g, TrajectoryGroup):
            raise TypeError(
                f"rollout.workflow {workflow}: afinish_group returned {type(g).__name__}, "
                "not a TrajectoryGroup or None"
            )
        if len(g) != n_samples:
            raise ValueError(
                f"rollout.workflow {workflow}: a group holds {len(g)} trajectories, "
                f"gconfig.n_samples is {n_samples}"
            )
        if max_episode_tokens is None:
            continue
        for t in g.trajectories:
            if len(t.input_ids) > max_episode_tokens:
                raise ValueError(
                    f"rollout.workflow {workflow}: a trajectory holds {len(t.input_ids)} "
                    f"tokens, more than rollout.max_episode_tokens ({max_episode_tokens}); "
                    "an episode must end once its budget is spent "
                    "(WorkflowContext.turn_sampling)"
                )


def groups_to_batch(groups: Sequence[TrajectoryGroup], pad_id: int) -> Batch:
    """The batch of ``groups``' trajectories, group after group, in order.

    Each row's first ``prompt_len`` tokens are left-padded to a common column ``P`` (the
    longest ``prompt_len``), the rest starts at ``P`` and is right-padded to the longest.
    Returns ``input_ids``, ``attention_mask``, ``loss_mask``, ``behave_logp``, ``versions``
    (``[N, T]``), ``rewards`` and ``no_eos`` (``[N]``); ``N = 0`` gives ``[0, 0]`` tensors.
    """
    trajs = [t for g in groups for t in g.trajectories]
    n = len(trajs)
    p = max((t.prompt_len for t in trajs), default=0)
    c = max((len(t.input_ids) - t.prompt_len for t in trajs), default=0)
    input_ids = torch.full((n, p + c), pad_id, dtype=torch.long)
    attention = torch.zeros((n, p + c), dtype=torch.bool)
    loss_mask = torch.zeros((n, p + c), dtype=torch.bool)
    behave_logp = torch.zeros((n, p + c), dtype=torch.float32)
    versions = torch.full((n, p + c), -1, dtype=torch.long)
    for i, t in enumerate(trajs):
        start = p - t.prompt_len
        cols = slice(start, start + len(t.input_ids))
        input_ids[i, cols] = torch.tensor(t.input_ids, dtype=torch.long)
        attention[i, cols] = True
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        loss_mask[i, cols] = mask
        behave_logp[i, cols] = torch.tensor(t.logprobs, dtype=torch.float32) * mask
        versions[i, cols] = torch.where(mask, torch.tensor(t.versions, dtype=torch.long), -1)
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "behave_logp": behave_logp,
        "versions": versions,
        "rewards": torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32),
        "no_eos": torch.tensor([bool(t.no_eos) for t in trajs], dtype=torch.bool),
    }


def sum_group_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """Every key of the groups' ``stats``, summed over the groups."""
    out: dict[str, float] = {}
    for g in groups:
        for k, v in g.stats.items():
            out[k] = out.get(k, 0.0) + float(v)
    return out
