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
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, RequestError, SamplingParams
from areal_m2po.api.errors import WorkflowError
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.rollout.batch_builder import check_groups, groups_to_batch, sum_group_stats
from areal_m2po.rollout.episode_errors import episode_failure
from areal_m2po.rollout.token_text import decode_completion
from areal_m2po.utils.aio import gather_or_cancel
from areal_m2po.utils.data import Batch

__all__ = [
    "Policy",
    "RefusalCount",
    "RolloutExecutor",
    "RolloutSetup",
    "arun_group",
    "arun_within",
]

logger = logging.getLogger("areal_m2po.rollout")

T = TypeVar("T")

Policy = Callable[[], Iterable[tuple[str, torch.Tensor]]]
"""Gives the trainer's current full weights as ``(name, tensor)`` pairs (consumed once)."""

_REWARD_COUNTS = ("reward/n_errors", "reward/n_timeouts", "reward/n_invalid")

CANCEL_GRACE_S = 10.0
"""Seconds an episode cancelled at its timeout gets to unwind (close its session, its
requests) before it is left running and the run goes on without it."""


class _TimedOut:
    """What :func:`arun_within` returns for a coroutine that ran past its timeout."""

    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT: Any = _TimedOut()


async def arun_within(start: Callable[[], Coroutine[Any, Any, T]], timeout_s: float | None) -> T:
    """``await start()``, or :data:`TIMED_OUT` once it has run ``timeout_s`` seconds (None: no
    limit). Past the limit it is cancelled and given :data:`CANCEL_GRACE_S` seconds to unwind;
    one that ignores the cancellation is left running (a warning says so). Cancelling this
    call cancels it. (``start`` makes the coroutine only once this call runs, so a call
    cancelled before it starts leaves no coroutine never awaited.)"""
    if timeout_s is None:
        return await start()
    task = asyncio.ensure_future(start())
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if task in done:
            return task.result()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        logger.warning(
            "an episode past its timeout ignored its cancellation for %gs; left running",
            CANCEL_GRACE_S,
        )
    elif not task.cancelled() and task.exception() is not None:
        logger.warning(
            "an episode past its timeout failed as it was cancelled: %s", task.exception()
        )
    return TIMED_OUT


async def arun_group(
    workflow: RolloutWorkflow,
    engine: InferenceEngine,
    record: dict[str, Any],
    n_samples: int,
    workflow_name: str = "rlvr",
    episode_timeout_s: float | None = None,
    on_timeout: Callable[[int], None] | None = None,
) -> TrajectoryGroup | None:
    """The group of one record: ``n_samples`` episodes of ``workflow`` at once, then its
    :meth:`~areal_m2po.api.workflow_api.RolloutWorkflow.afinish_group`; None when an episode
    or the group was dropped. ``workflow_name`` (``rollout.workflow``) names the workflow in
    the one-line error of an episode that returns something else than a Trajectory or None.

    An episode still running after ``episode_timeout_s`` seconds (``rollout.episode_timeout_s``;
    None: no limit) is cancelled and its group dropped; ``on_timeout(k)`` is told how many of
    the group's episodes timed out."""
    try:
        episodes = await gather_or_cancel(
            *(
                arun_within(lambda: workflow.arun_episode(engine, record), episode_timeout_s)
                for _ in range(n_samples)
            )
        )
    except RequestError:  # the engine refused the record: the caller drops the group
        raise
    except Exception as exc:
        raise episode_failure(workflow_name, exc) from exc
    timed_out = sum(t is TIMED_OUT for t in episodes)
    if timed_out:
        logger.warning(
            "rollout.episode_timeout_s: %d of %d episodes of record %r ran past %gs; group dropped",
            timed_out,
            n_samples,
            str(record.get("question"))[:60],
            episode_timeout_s,
        )
        if on_timeout is not None:
            on_timeout(timed_out)
        return None
    for t in episodes:
        if t is not None and not isinstance(t, Trajectory):
            raise WorkflowError(
                f"rollout.workflow {workflow_name}: arun_episode returned {type(t).__name__}, "
                "not a Trajectory or None"
            )
    done = [t for t in episodes if t is not None]
    if len(done) < len(episodes):
        return None
    return await workflow.afinish_group(record, done)


class RefusalCount:
    """Groups dropped because the engine refused one of their requests, since the last
    :meth:`take` (counted on the loop thread, taken on the trainer's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self._last = ""

    def add(self, reason: str) -> None:
        with self._lock:
            self._n += 1
            self._last = reason

    def take(self) -> tuple[int, str]:
        """How many since the last call, and the last one's reason."""
        with self._lock:
            taken = (self._n, self._last)
            self._n = 0
        return taken


@dataclass(frozen=True)
class RolloutSetup:
    """What every executor is built from: a workflow to run on an engine.

    Args:
        engine: the inference engine.
        workflow: the rollout workflow.
        context: what the workflow was built with (tokenizer, sampling, reward sources).
        pad_id: padding token id of the batch layout.
        workflow_name: ``rollout.workflow`` as configured (for error messages).
        episode_timeout_s: ``rollout.episode_timeout_s``: seconds one episode (or one
            evaluation episode) may run; None: no limit.
    """

    engine: InferenceEngine
    workflow: RolloutWorkflow
    context: WorkflowContext
    pad_id: int
    workflow_name: str = "rlvr"
    episode_timeout_s: float | None = None


class RolloutExecutor(abc.ABC):
    """Runs ``setup.workflow`` on ``setup.engine`` for the trainer; the fields of ``setup``
    (:class:`RolloutSetup`) are its attributes."""

    def __init__(self, setup: RolloutSetup) -> None:
        self.engine = setup.engine
        self.workflow = setup.workflow
        self.context = setup.context
        self.pad_id = setup.pad_id
        self.workflow_name = setup.workflow_name
        self.episode_timeout_s = setup.episode_timeout_s
        self.n_samples = setup.context.gconfig.n_samples
        self._timeouts = 0  # episodes timed out since the last batch was built
        self._timeouts_lock = threading.Lock()  # (async mode counts on its loop thread)
        self.queue: collections.deque[tuple[Batch, dict[str, float]]] = collections.deque()
        self.n_rollouts = 0  # batches generated so far (sync mode: seeds the sampler)
        self.refused = RefusalCount()

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
        """The group of ``record`` (``n_samples`` episodes; see :func:`arun_group`); None, with
        a warning and a count (``rollout/n_refused_groups``), when the engine refused one of
        its requests (:class:`~areal_m2po.api.engine_api.RequestError`: the record cannot be
        served, the engine is fine, so the run goes on without it)."""
        try:
            return await arun_group(
                self.workflow,
                self.engine,
                record,
                self.n_samples,
                self.workflow_name,
                self.episode_timeout_s,
                self._count_timeouts,
            )
        except RequestError as exc:
            self.refused.add(str(exc))
            question = str(record.get("question"))[:60]
            logger.warning("record %r dropped: the engine refused it: %s", question, exc)
            return None

    def _count_timeouts(self, n: int) -> None:
        with self._timeouts_lock:
            self._timeouts += n

    def _take_timeouts(self) -> int:
        """Episodes timed out since the last call."""
        with self._timeouts_lock:
            n, self._timeouts = self._timeouts, 0
        return n

    def _build(
        self, groups: Sequence[TrajectoryGroup | None], epoch: int, gen_s: float
    ) -> tuple[Batch, dict[str, float]]:
        """The batch of the kept groups (in order) and its metrics."""
        kept = [g for g in groups if g is not None]
        n_refused, reason = self.refused.take()
        timeouts = self._take_timeouts()
        if not kept:
            why = f", {timeouts} episodes past rollout.episode_timeout_s" if timeouts else ""
            why += f"; {n_refused} refused by the engine, e.g. {reason}" if n_refused else ""
            raise WorkflowError(
                f"rollout.workflow {self.workflow_name}: every group of a batch was dropped "
                f"({len(groups)} groups{why}); nothing to train on"
            )
        check_groups(kept, self.n_samples, self.workflow_name, self.context.max_episode_tokens)
        finish = self.workflow.finish_batch(kept)
        info: dict[str, float] = dict.fromkeys(_REWARD_COUNTS, 0.0)
        info["timing/reward_s"] = 0.0
        info.update(sum_group_stats(kept))
        info.update(
            {
                "timing/gen_s": gen_s,
                "rollout/epoch": float(epoch),
                "rollout/n_dropped_groups": float(len(groups) - len(kept)),
                "rollout/n_refused_groups": float(n_refused),
                "rollout/n_episode_timeouts": float(timeouts),
                **finish,
                **self.engine.metrics(),
            }
        )
        return groups_to_batch(kept, self.pad_id), info

    def evaluate(self, records: Sequence[dict[str, Any]], batch_size: int) -> dict[str, float]:
        """Sums over ``records`` (``batch_size`` at a time), held-out evaluation: ``n``,
        ``correct``, every name of the workflow's ``eval_metrics`` and ``timed_out`` (always
        all present, so ranks can reduce them in one order). A record is evaluated by the
        workflow's :meth:`~areal_m2po.api.workflow_api.RolloutWorkflow.aevaluate` (a whole
        greedy episode), or when that gives None by one greedy completion of its prompt,
        correct when its verifiable reward exceeds 0.5. An evaluation episode past
        ``episode_timeout_s`` counts as failed: ``timed_out`` 1, every other value 0."""
        return self.run(self._evaluate(list(records), batch_size))

    async def _evaluate(self, records: list[dict[str, Any]], batch_size: int) -> dict[str, float]:
        names = tuple(self.workflow.eval_metrics)
        sums = dict.fromkeys(("n", "correct", *names, "timed_out"), 0.0)
        for i in range(0, len(records), batch_size):
            chunk = records[i : i + batch_size]
            try:
                results = await gather_or_cancel(
                    *(arun_within(self._evaluation(r), self.episode_timeout_s) for r in chunk)
                )
            except Exception as exc:
                raise episode_failure(self.workflow_name, exc, "an evaluation episode") from exc
            for r, result in zip(chunk, results):
                if result is TIMED_OUT:
                    logger.warning(
                        "rollout.episode_timeout_s: the evaluation episode of record %r ran "
                        "past %gs; counted as failed",
                        str(r.get("question"))[:60],
                        self.episode_timeout_s,
                    )
                    sums["timed_out"] += 1.0
                    continue
                if result is None:
                    continue
                missing = {"correct", *names} - set(result)
                if missing:
                    raise WorkflowError(
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

    def _evaluation(
        self, record: dict[str, Any]
    ) -> Callable[[], Coroutine[Any, Any, dict[str, float] | None]]:
        """Starts the workflow's evaluation of ``record`` (on a copy)."""
        return lambda: self.workflow.aevaluate(self.engine, dict(record))

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
        ids = [list(r.output_ids) for r in responses]
        rewards, _ = await asyncio.to_thread(ctx.reward.score_verifiable, records, texts, ids)
        return float(sum(1.0 for x in rewards if x > 0.5))
