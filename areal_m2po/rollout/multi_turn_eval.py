"""Greedy evaluation of multi-turn episodes: success rate, tool use and second turns.

The trainer's in-training evaluation is single-turn (one greedy completion of the prompt);
this runs the whole episode of :class:`~areal_m2po.rollout.multi_turn.MultiTurnWorkflow`
greedily, one episode per record, and reports what the tool-use demo measures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_m2po.api.engine_api import InferenceEngine, SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.multi_turn import MultiTurnWorkflow

__all__ = ["EpisodeEval", "evaluate_multi_turn"]


@dataclass(frozen=True)
class EpisodeEval:
    """Fractions over ``n`` greedy episodes (``solved``: raw reward > 0.5, before discount)."""

    n: int
    solved: float
    used_tool: float
    second_turn: float
    mean_turns: float

    @property
    def solved_se(self) -> float:
        """Binomial standard error of :attr:`solved`."""
        return math.sqrt(self.solved * (1 - self.solved) / self.n) if self.n else 0.0

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "solved_se": self.solved_se}


async def evaluate_multi_turn(
    engine: InferenceEngine,
    context: WorkflowContext,
    records: Sequence[dict[str, Any]],
    batch_size: int = 32,
    **workflow_kwargs: Any,
) -> EpisodeEval:
    """One greedy episode per record (``batch_size`` at a time) with ``workflow_kwargs``."""
    if not records:
        raise ValueError("evaluate_multi_turn: no records")
    greedy = dataclasses.replace(
        context,
        gconfig=dataclasses.replace(context.gconfig, n_samples=1),
        sampling=SamplingParams.from_gconfig(context.gconfig, greedy=True),
    )
    workflow = MultiTurnWorkflow(greedy, **workflow_kwargs)
    solved = tool = second = turns = 0.0
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        groups = await asyncio.gather(*(workflow.arun_episode(engine, dict(r)) for r in chunk))
        for group in groups:
            if group is None:
                raise RuntimeError("evaluate_multi_turn: the engine aborted an episode")
            info = group.trajectories[0].info
            solved += float(info["raw_reward"] > 0.5)
            tool += float(info["tool_calls"] > 0)
            second += float(info["turns"] > 1)
            turns += float(info["turns"])
    n = len(records)
    return EpisodeEval(n, solved / n, tool / n, second / n, turns / n)
