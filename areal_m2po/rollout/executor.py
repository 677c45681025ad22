"""What both executors share: the trainer-facing calls, building a batch, evaluation.

An executor runs a :class:`~areal_m2po.api.workflow_api.RolloutWorkflow` against an
:class:`~areal_m2po.api.engine_api.InferenceEngine` and hands the trainer whole batches. The
trainer sees only these calls: :meth:`RolloutExecutor.start`, :meth:`~RolloutExecutor.prefill_one`,
:meth:`~RolloutExecutor.next_batch`, :meth:`~RolloutExecutor.update_weights`,
:meth:`~RolloutExecutor.evaluate`, the checkpoint state and :meth:`~RolloutExecutor.close`.
"""

from __future__ import annotations

import abc
import asyncio
import collections
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, SamplingParams
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.rollout.batch_builder import check_groups, groups_to_batch, sum_group_stats
from areal_m2po.rollout.token_text import decode_completion
from areal_m2po.utils.aio import gather_or_cancel
from areal_m2po.utils.data import Batch

__all__ = ["Policy", "RolloutExecutor", "RolloutSetup", "arun_group"]

Policy = Callable[[], Iterable[tuple[str, torch.Tensor]]]
"""Gives the trainer's current full weights as ``(name, tensor)`` pairs (consumed once)."""

_REWARD_COUNTS = ("reward/n_errors", "reward/n_timeouts", "reward/n_invalid")


async def arun_group(
    workflow: RolloutWorkflow,
    engine: InferenceEngine,
    record: dict[str, Any],
    n_samples: int,
    workflow_name: str = "rlvr",
) -> TrajectoryGroup | None:
    """The group of one record: ``n_samples`` episodes of ``workflow`` at once, then its
    :meth:`~areal_m2po.api.workflow_api.RolloutWorkflow.afinish_group`; None when an episode
    or the group was dropped. ``workflow_name`` (``rollout.workflow``) names the workflow in
    the one-line error of an episode that returns something else than a Trajectory or None."""
    episodes = await gather_or_cancel(
        *(workflow.arun_episode(engine, record) for _ in range(n_samples))
    )
    for t in episodes:
        if t is not None and not isinstance(t, Trajectory):
            raise TypeError(
                f"rollout.workflow {workflow_name}: arun_episode returned {type(t).__name__}, "
                "not a Trajectory or None"
            )
    if any(t is None for t in episodes):
        return None
    return await workflow.afinish_group(record, list(episodes))


@dataclass(frozen=True)
class RolloutSetup:
    """What every executor is built from: a workflow to run on an engine.

    Args:
        engine: the inference engine.
        workflow: the rollout workflow.
        context: what the workflow was built with (tokenizer, sampling, reward sources).
        pad_id: padding token id of the batch layout.
        workflow_name: ``rollout.workflow`` as configured (for error messages).
    """

    engine: InferenceEngine
    workflow: RolloutWorkflow
    context: WorkflowContext
    pad_id: int
    workflow_name: str = "rlvr"


class RolloutExecutor(abc.ABC):
    """Runs ``setup.workflow`` on ``setup.engine`` for the trainer; the fields of ``setup``
    (:class:`RolloutSetup`) are its attributes."""

    def __init__(self, setup: RolloutSetup) -> None:
        self.engine = setup.engine
        self.workflow = setup.workflow
        self.context = setup.context
        self.pad_id = setup.pad_id
        self.workflow_name = setup.workflow_name
        self.n_samples = setup.context.gconfig.n_samples
        self.queue: collections.deque[tuple[Batch, dict[str, float]]] = collections.deque()
        self.n_rollouts = 0  # batches generated so far (sync mode: seeds the sampler)

    # -- the trainer's calls ------------------------------------------------------------------

    @abc.abstractmethod
    def start(self, policy: Policy, version: int) -> None:
        """Ready the engine at the policy's ``version`` and start generating when due."""

    def prefill_needed(self) -> bool:
        """Whether a batch must be generated ahead before the first step (sync mode, until
        ``rollout.staleness`` are queued)."""
        return False

    def prefill_one(self) -> None:  # noqa: B027 - only sync mode queues batches ahead
        """Generate one batch ahead (see :meth:`prefill_needed`)."""

    @abc.abstractmethod
    def next_batch(self) -> tuple[Batch, dict[str, float]]:
        """The batch to train on now, and its rollout metrics."""

    @abc.abstractmethod
    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, float]:
        """Hand the engine the trainer's new weights as ``version``; metrics of the hand-over."""

    @abc.abstractmethod
    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the loop the engine is served from; its result."""

    def close(self) -> None:
        """Close the workflow (its endpoint, threads), then destroy the engine."""
        try:
            self.workflow.close()
        finally:
            self.engine.destroy()

    # -- checkpoints --------------------------------------------------------------------------

    def engine_state(
        self, policy: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> dict[str, Any]:
        """``version`` and ``weights`` of the engine for a recover checkpoint (``weights``
        None: the policy's, which the checkpoint holds). ``policy`` may be a collective."""
        state = getattr(self.engine, "state_dict", None)
        if state is not None:
            return dict(state(policy, policy_version))
        return {"version": self.engine.get_version(), "weights": None}

    def load_engine_state(self, state: Mapping[str, Any], policy: Policy) -> None:
        load = getattr(self.engine, "load_state_dict", None)
        if load is not None:
            load(state, policy)
        else:  # the weights are loaded at start()
            self.engine.set_version(int(state["version"]))

    # -- shared -------------------------------------------------------------------------------

    async def _group(self, record: dict[str, Any]) -> TrajectoryGroup | None:
        """The group of ``record`` (``n_samples`` episodes; see :func:`arun_group`)."""
        return await arun_group(
            self.workflow, self.engine, record, self.n_samples, self.workflow_name
        )

    def _build(
        self, groups: Sequence[TrajectoryGroup | None], epoch: int, gen_s: float
    ) -> tuple[Batch, dict[str, float]]:
        """The batch of the kept groups (in order) and its metrics."""
        kept = [g for g in groups if g is not None]
        if not kept:
            raise RuntimeError(
                f"rollout.workflow {self.workflow_name}: every group of a batch was dropped "
                f"({len(groups)} episodes returned None); nothing to train on"
            )
        check_groups(kept, self.n_samples, self.workflow_name)
        finish = self.workflow.finish_batch(kept)
        info: dict[str, float] = dict.fromkeys(_REWARD_COUNTS, 0.0)
        info["timing/reward_s"] = 0.0
        info.update(sum_group_stats(kept))
        info.update(
            {
                "timing/gen_s": gen_s,
                "rollout/epoch": float(epoch),
                "rollout/n_dropped_groups": float(len(groups) - len(kept)),
                **finish,
                **self.engine.metrics(),
            }
        )
        return groups_to_batch(kept, self.pad_id), info

    def evaluate(self, records: Sequence[dict[str, Any]], batch_size: int) -> dict[str, float]:
        """Sums over ``records`` (``batch_size`` at a time), held-out evaluation: ``n``,
        ``correct`` and every name of the workflow's ``eval_metrics`` (always all present, so
        ranks can reduce them in one order). A record is evaluated by the workflow's
        :meth:`~areal_m2po.api.workflow_api.RolloutWorkflow.aevaluate` (a whole greedy
        episode), or when that gives None by one greedy completion of its prompt, correct
        when its verifiable reward exceeds 0.5."""
        return self.run(self._evaluate(list(records), batch_size))

    async def _evaluate(self, records: list[dict[str, Any]], batch_size: int) -> dict[str, float]:
        names = tuple(self.workflow.eval_metrics)
        sums = dict.fromkeys(("n", "correct", *names), 0.0)
        for i in range(0, len(records), batch_size):
            chunk = records[i : i + batch_size]
            results = await gather_or_cancel(
                *(self.workflow.aevaluate(self.engine, dict(r)) for r in chunk)
            )
            for r, result in zip(chunk, results):
                if result is None:
                    continue
                missing = {"correct", *names} - set(result)
                if missing:
                    raise RuntimeError(
                        f"rollout.workflow {self.workflow_name}: aevaluate returned no "
                        f"{', '.join(sorted(missing))} for record {str(r.get('question'))[:60]!r}"
                    )
                for key in ("correct", *names):
                    sums[key] += float(result[key])
            plain = [r for r, result in zip(chunk, results) if result is None]
            if plain:
                sums["correct"] += await self._evaluate_single_turn(plain)
            sums["n"] += len(chunk)
        return sums

    async def _evaluate_single_turn(self, records: list[dict[str, Any]]) -> float:
        """How many greedy completions of ``records`` score a verifiable reward above 0.5."""
        ctx = self.context
        greedy = SamplingParams.from_gconfig(ctx.gconfig, greedy=True)
        responses = await gather_or_cancel(
            *(self.engine.agenerate(ModelRequest(list(r["prompt_ids"]), greedy)) for r in records)
        )
        texts = [
            decode_completion(ctx.tokenizer, r.output_ids, ctx.eos_token_ids) for r in responses
        ]
        rewards, _ = await asyncio.to_thread(ctx.reward.score_verifiable, records, texts)
        return float(sum(1.0 for x in rewards if x > 0.5))
