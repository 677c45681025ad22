"""Every reward source the config names, behind one call per group and one per batch.

:class:`RewardSources` holds the verifiable reward function (``reward.path``, run by a
:class:`~areal_m2po.reward.runner.RewardRunner` with the record's other columns as keyword
arguments) and, with ``reward.model``, the learned reward
(:class:`~areal_m2po.reward.reward_model.LearnedReward`). A workflow awaits
:meth:`RewardSources.ascore` for the completions of one record; the learned reward's
normalisation (``reward.model.norm``: over the batch and all ranks, or running) and its batch
statistics need the whole batch, so :meth:`RewardSources.finish_batch` applies them once per
batch (a workflow's :meth:`~areal_m2po.api.workflow_api.RolloutWorkflow.finish_batch` calls
it). The reward of a sample is then ``weight * normalise(score) + verifiable_weight *
verifiable``, as :meth:`LearnedReward.rewards` computes it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_m2po.api.workflow_api import TrajectoryGroup
from areal_m2po.reward.runner import RewardRunner, extra_fields

__all__ = ["GroupScores", "RewardSources"]

VERIFIABLE = "reward/verifiable_score"
"""``Trajectory.info`` key of a sample's verifiable reward (when a learned reward is on)."""
MODEL_SCORE = "reward/model_raw_score"
"""``Trajectory.info`` key of a sample's raw learned-reward score."""


@dataclass
class GroupScores:
    """Rewards of the completions of one record.

    Args:
        rewards: one per completion (final unless a learned reward normalises over the batch,
            which :meth:`RewardSources.finish_batch` then rewrites).
        info: one dict per completion, to store in ``Trajectory.info`` (the reward parts
            ``finish_batch`` reads).
        stats: the reward runner's counters (``reward/n_errors``, ...), summed per batch.
        seconds: wall-clock time spent scoring.
    """

    rewards: list[float]
    info: list[dict[str, float]]
    stats: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


class RewardSources:
    """The verifiable reward and, optionally, the learned one.

    Args:
        runner: runs the verifiable reward function (``reward.path``).
        learned: the learned reward (``reward.model``), or None.
    """

    def __init__(self, runner: RewardRunner, learned: Any = None) -> None:
        self.runner = runner
        self.learned = learned
        self._model_lock = threading.Lock()  # one reward-model forward at a time

    def score_verifiable(
        self,
        records: Sequence[Mapping[str, Any]],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> tuple[list[float], dict[str, float]]:
        """The verifiable reward of each (record, completion) and the runner's counters; an
        AReaL reward function also gets each record's ``prompt_ids`` and ``completion_ids[i]``
        (``[]`` when not given)."""
        return self.runner.score(
            [r["prompt_text"] for r in records],
            list(completions),
            [r["answer"] for r in records],
            [extra_fields(r) for r in records],
            [list(r.get("prompt_ids") or []) for r in records],
            completion_ids,
        )

    def _model_scores(
        self, records: Sequence[Mapping[str, Any]], completions: Sequence[str]
    ) -> torch.Tensor:
        with self._model_lock:
            return self.learned.raw_scores([r["question"] for r in records], list(completions))

    async def ascore(
        self,
        records: Sequence[Mapping[str, Any]],
        completions: Sequence[str],
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> GroupScores:
        """Score ``completions[i]`` (token ids ``completion_ids[i]``, for an AReaL reward
        function) of ``records[i]`` with every source (in worker threads)."""
        t0 = time.perf_counter()
        verifiable, stats = await asyncio.to_thread(
            self.score_verifiable, records, completions, completion_ids
        )
        if self.learned is None:
            return GroupScores(
                verifiable, [{} for _ in verifiable], stats, time.perf_counter() - t0
            )
        raw = await asyncio.to_thread(self._model_scores, records, completions)
        raw_list = [float(x) for x in raw.tolist()]
        rewards = [self.learned.mix_raw(s, v) for s, v in zip(raw_list, verifiable)]
        info = [{VERIFIABLE: v, MODEL_SCORE: s} for v, s in zip(verifiable, raw_list)]
        return GroupScores(rewards, info, stats, time.perf_counter() - t0)

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """With a learned reward: every trajectory's reward from the batch's scores
        (normalised as ``reward.model.norm`` says) and ``reward/model_score``,
        ``reward/model_score_std``, ``reward/verifiable``, ``reward/model_verifiable_corr``
        (over all ranks; every rank calls it once per batch). Without: nothing."""
        if self.learned is None:
            return {}
        trajs = [t for g in groups for t in g.trajectories]
        missing = [t for t in trajs if MODEL_SCORE not in t.info or VERIFIABLE not in t.info]
        if missing:
            raise ValueError(
                f"reward.model is set but {len(missing)} trajectories carry no "
                f"{MODEL_SCORE!r}/{VERIFIABLE!r} info: the workflow must score with "
                "RewardSources.ascore"
            )
        raw = torch.tensor([t.info[MODEL_SCORE] for t in trajs], dtype=torch.float32)
        verifiable = torch.tensor([t.info[VERIFIABLE] for t in trajs], dtype=torch.float32)
        rewards, stats = self.learned.combine(raw, verifiable)
        for t, r in zip(trajs, rewards.tolist()):
            t.reward = float(r)
        return stats
