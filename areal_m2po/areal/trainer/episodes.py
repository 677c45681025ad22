"""An AReaL workflow run as this package's rollout workflow.

:class:`ArealEpisodes` is a :class:`areal_m2po.api.workflow_api.RolloutWorkflow` over an AReaL
:class:`~areal_m2po.areal.api.workflow_api.RolloutWorkflow`: each of the executor's
``gconfig.n_samples`` episodes of a record calls the AReaL workflow's
``arun_episode(engine, data)`` (``engine`` the AReaL view of this package's engine, ``data``
the AReaL record) and turns the returned tensor dict (or the one interaction an
``ArealOpenAI`` client exported) into a
:class:`~areal_m2po.api.workflow_api.Trajectory`: ``input_ids`` where ``attention_mask`` is
set, ``loss_mask``, ``logprobs`` and per-token ``versions`` as they are (staleness and M2PO
read them), ``rewards`` as the reward. None drops the record's group.

Grouping, as areal-project/AReaL cbff54d6 does it: the trainer runs the workflow
``n_samples`` times per record (``GroupedRolloutWorkflow``), each episode returning one row.
An older AReaL workflow generates the record's ``n_samples`` completions inside one episode and
returns ``n_samples`` rows; run ``n_samples`` times that would give the record n x n samples.
So the first record's first episode runs alone: one row, and every episode runs the workflow
(cbff54d6's kind); ``n_samples`` rows, and from then on one episode per record runs it and its
rows are the group. Any other row count is refused in one line.

``dynamic_filter_fn`` (AReaL's ``should_accept_fn``) gets the group's rows concatenated as
AReaL's dict and drops the group when it returns False. Evaluation (``eval_workflow``) runs
one episode per held-out record; its mean reward is logged as ``eval/reward`` and a reward
above 0.5 counts as correct (``eval/accuracy``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.errors import WorkflowError
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.areal.api.engine_api import InferenceEngine as ArealEngine
from areal_m2po.areal.infra import workflow_context
from areal_m2po.areal.utils import stats_tracker

__all__ = ["AREAL_DATA", "ArealEpisodes", "areal_record", "rows_to_trajectories", "to_tensor_dict"]

AREAL_DATA = "areal_data"
"""The record key holding the AReaL record itself (what ``arun_episode`` gets as ``data``)."""

_ROWS = "areal_rows"
_STATS = "areal_stats"


def _row(tensor: Any, i: int, name: str) -> list[Any]:
    if not isinstance(tensor, torch.Tensor):
        raise WorkflowError(f"AReaL workflow: {name!r} is a {type(tensor).__name__}, not a tensor")
    return tensor[i].tolist() if tensor.dim() > 1 else tensor.tolist()


def rows_to_trajectories(
    result: dict[str, Any], eos_ids: Sequence[int], name: str = "workflow"
) -> list[Trajectory]:
    """The trajectories of AReaL's tensor dict (``[k, T]`` tensors, ``rewards`` ``[k]``), one
    per row; the prompt is the tokens before the first ``loss_mask`` 1.

    Raises:
        WorkflowError: one line naming the missing or malformed key.
    """
    missing = [
        k for k in ("input_ids", "loss_mask", "logprobs", "versions", "rewards") if k not in result
    ]
    if missing:
        raise WorkflowError(f"AReaL {name}: arun_episode's dict has no {', '.join(missing)}")
    ids = result["input_ids"]
    k = ids.shape[0] if ids.dim() > 1 else 1
    rewards = result["rewards"].reshape(-1).tolist()
    if len(rewards) != k:
        raise WorkflowError(f"AReaL {name}: {len(rewards)} rewards for {k} rows of input_ids")
    mask_t = result.get("attention_mask")
    out = []
    for i in range(k):
        keep = [bool(x) for x in _row(mask_t, i, "attention_mask")] if mask_t is not None else None
        cols = {
            n: _row(result[n], i, n) for n in ("input_ids", "loss_mask", "logprobs", "versions")
        }
        if keep is not None:
            cols = {n: [x for x, m in zip(v, keep) if m] for n, v in cols.items()}
        loss = [bool(x) for x in cols["loss_mask"]]
        if not any(loss):
            raise WorkflowError(f"AReaL {name}: row {i} has no token with loss_mask 1")
        last = max(j for j, m in enumerate(loss) if m)
        out.append(
            Trajectory(
                input_ids=[int(t) for t in cols["input_ids"]],
                loss_mask=loss,
                logprobs=[float(x) if m else 0.0 for x, m in zip(cols["logprobs"], loss)],
                versions=[int(v) if m else -1 for v, m in zip(cols["versions"], loss)],
                prompt_len=loss.index(True),
                reward=float(rewards[i]),
                no_eos=int(cols["input_ids"][last]) not in eos_ids,
            )
        )
    return out


def _interaction_row(interactions: dict[str, Any], name: str) -> dict[str, Any]:
    """The tensor dict of the one interaction an episode exported (AReaL's
    ``export_interactions``); an episode is one trajectory here.

    Raises:
        WorkflowError: more than one interaction.
    """
    if len(interactions) != 1:
        raise WorkflowError(
            f"AReaL {name}: arun_episode returned {len(interactions)} interactions; an episode "
            "trains as one trajectory here: ArealOpenAI(chat_template_type='concat') and "
            "export_interactions(style='concat') give its one chain"
        )
    return next(iter(interactions.values())).to_tensor_dict()


_OWN_KEYS = frozenset({"prompt_ids", "prompt_text", AREAL_DATA})


def areal_record(record: dict[str, Any]) -> dict[str, Any]:
    """What an AReaL workflow gets as ``data``: the AReaL row kept under ``areal_data``, or
    (a record of this package's data sets) the record without this trainer's own
    ``prompt_ids``/``prompt_text``, which AReaL's reward call would pass twice."""
    if AREAL_DATA in record:
        return dict(record[AREAL_DATA])
    return {k: v for k, v in record.items() if k not in _OWN_KEYS}


@dataclass
class _Shared:
    """The first episode's rows of one record, shared with the record's other episodes."""

    record: dict[str, Any]
    rows: asyncio.Future[list[Trajectory] | None]
    started: int = 1


class ArealEpisodes(RolloutWorkflow):
    """This package's workflow running AReaL workflow ``workflow`` (see the module doc).

    Args:
        context: the trainer's workflow context.
        workflow: the AReaL workflow of training episodes.
        eval_workflow: the AReaL workflow of evaluation episodes; None: the trainer's own
            greedy single-turn evaluation.
        dynamic_filter_fn: AReaL's ``should_accept_fn`` on a group's concatenated dict.
    """

    eval_metrics = ("reward",)

    def __init__(
        self,
        context: WorkflowContext,
        workflow: Any,
        eval_workflow: Any = None,
        dynamic_filter_fn: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        self.context = context
        self.workflow, self.eval_workflow = workflow, eval_workflow
        self.dynamic_filter_fn = dynamic_filter_fn
        self.name = type(workflow).__name__
        self.n = context.gconfig.n_samples
        self.rows_per_episode: int | None = None  # learnt from the first episode
        self._shared: dict[int, _Shared] = {}

    async def _run(
        self, engine: Any, record: dict[str, Any], ctx: workflow_context.WorkflowContext
    ) -> tuple[list[Trajectory] | None, dict[str, list[float]]]:
        workflow_context.set(
            dataclasses.replace(ctx, max_episode_tokens=self.context.max_episode_tokens)
        )
        recorder = stats_tracker.Recorder()
        stats_tracker.use_recorder(recorder)
        wf = self.eval_workflow if ctx.is_eval else self.workflow
        result = await wf.arun_episode(ArealEngine(engine), areal_record(record))
        if result is None:
            return None, recorder.values
        if not isinstance(result, dict):
            raise WorkflowError(
                f"AReaL {self.name}: arun_episode returned {type(result).__name__}, not AReaL's "
                "dict of tensors or None (agents with run() go through the agent workflow)"
            )
        if result and all(hasattr(v, "to_tensor_dict") for v in result.values()):
            result = _interaction_row(result, self.name)
        return rows_to_trajectories(result, self.context.eos_token_ids, self.name), recorder.values

    async def arun_episode(self, engine: Any, record: dict[str, Any]) -> Trajectory | None:
        if self.rows_per_episode == 1:
            return self._one(*await self._run(engine, record, workflow_context.WorkflowContext()))
        shared = self._shared.get(id(record))
        if shared is None or shared.record is not record:
            return await self._first(engine, record)
        shared.started += 1
        index = shared.started - 1
        self._close_if_full(shared)
        rows = await shared.rows
        if self.rows_per_episode == 1:  # learnt on this record: run an episode of its own
            ctx = workflow_context.WorkflowContext(sample_idx=index)
            return self._one(*await self._run(engine, record, ctx))
        return None if rows is None else rows[index]

    def _close_if_full(self, shared: _Shared) -> None:
        """No more episodes join ``shared`` once the group has its ``n`` (the same record
        object in two groups of a batch starts a second one)."""
        if shared.started >= self.n and self._shared.get(id(shared.record)) is shared:
            del self._shared[id(shared.record)]

    def _check_rows(self, rows: list[Trajectory]) -> None:
        """Learn (first record) or check the workflow's rows per episode: 1 or ``n``."""
        if self.rows_per_episode is None and len(rows) in (1, self.n):
            self.rows_per_episode = len(rows)
        if len(rows) != self.rows_per_episode:
            expected = (
                f"{self.rows_per_episode} as before"
                if self.rows_per_episode is not None
                else f"1 (one sample) or gconfig.n_samples={self.n} (the record's group)"
            )
            raise WorkflowError(
                f"AReaL {self.name}: arun_episode returned {len(rows)} rows; expected {expected}"
            )

    async def _first(self, engine: Any, record: dict[str, Any]) -> Trajectory | None:
        shared = _Shared(record, asyncio.get_running_loop().create_future())
        self._shared[id(record)] = shared
        self._close_if_full(shared)
        try:
            rows, stats = await self._run(engine, record, workflow_context.WorkflowContext())
            if rows is not None:
                self._check_rows(rows)
                rows[0].info[_STATS] = stats
        except BaseException as exc:
            shared.rows.set_exception(exc)
            shared.rows.exception()  # marked retrieved: the group's episodes report it
            self._shared.pop(id(record), None)
            raise
        shared.rows.set_result(rows)
        return None if rows is None else rows[0]

    @staticmethod
    def _one(rows: list[Trajectory] | None, stats: dict[str, list[float]]) -> Trajectory | None:
        if rows is None:
            return None
        if len(rows) != 1:
            raise WorkflowError(f"arun_episode returned {len(rows)} rows after 1 row before")
        rows[0].info[_STATS] = stats
        return rows[0]

    async def afinish_group(
        self, record: dict[str, Any], trajectories: list[Trajectory]
    ) -> TrajectoryGroup | None:
        keep = self.dynamic_filter_fn
        if keep is not None and not keep(to_tensor_dict(trajectories)):
            return None
        return TrajectoryGroup(trajectories)

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """The mean of every ``stats_tracker`` value the batch's episodes recorded, logged
        as ``areal/<key>``."""
        sums: dict[str, list[float]] = {}
        for group in groups:
            for t in group.trajectories:
                for key, values in t.info.pop(_STATS, {}).items():
                    sums.setdefault(key, []).extend(values)
        return {f"areal/{k}": sum(v) / len(v) for k, v in sums.items() if v}

    async def aevaluate(self, engine: Any, record: dict[str, Any]) -> dict[str, float] | None:
        if self.eval_workflow is None:
            return None
        ctx = workflow_context.WorkflowContext(is_eval=True)
        rows, _ = await self._run(engine, record, ctx)
        if not rows:
            return {"correct": 0.0, "reward": 0.0}
        reward = sum(t.reward for t in rows) / len(rows)
        if not math.isfinite(reward):
            raise WorkflowError(f"AReaL {self.name}: evaluation reward {reward} is not finite")
        return {"correct": float(reward > 0.5), "reward": reward}


def to_tensor_dict(trajectories: Sequence[Trajectory]) -> dict[str, torch.Tensor]:
    """AReaL's dict of ``trajectories`` (right-padded ``[k, T]``; ``rewards`` ``[k]``)."""
    width = max(len(t.input_ids) for t in trajectories)

    def pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=dtype)

    ts = list(trajectories)
    return {
        "input_ids": pad([t.input_ids for t in ts], 0, torch.int32),
        "loss_mask": pad([[int(m) for m in t.loss_mask] for t in ts], 0, torch.int32),
        "logprobs": pad([t.logprobs for t in ts], 0.0, torch.float32),
        "versions": pad([t.versions for t in ts], -1, torch.int32),
        "attention_mask": pad([[True] * len(t.input_ids) for t in ts], False, torch.bool),
        "rewards": torch.tensor([t.reward for t in ts], dtype=torch.float32),
    }
