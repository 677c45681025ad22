"""Greedy evaluation of multi-turn episodes: success rate, tool use and second turns.

The trainer's in-training evaluation of ``rollout.workflow=multi_turn`` runs the same greedy
episodes (:meth:`.workflow.MultiTurnWorkflow.aevaluate`); this runs them on any engine and
model outside a training run (``scripts/eval_multi_turn.py``), one episode per record, and
reports what the tool-use demo measures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_m2po.api.engine_api import InferenceEngine
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.workflows.multi_turn.workflow import MultiTurnWorkflow
from areal_m2po.utils.aio import gather_or_cancel

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
    workflow = MultiTurnWorkflow(context, **workflow_kwargs)
    sums = dict.fromkeys(("correct", *workflow.eval_metrics), 0.0)
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        results = await gather_or_cancel(*(workflow.aevaluate(engine, dict(r)) for r in chunk))
        for result in results:
            assert result is not None  # MultiTurnWorkflow always evaluates episodes
            for key in sums:
                sums[key] += result[key]
    n = len(records)
    return EpisodeEval(
        n,
        sums["correct"] / n,
        sums["tool_use_fraction"] / n,
        sums["second_turn_fraction"] / n,
        sums["turns_mean"] / n,
    )
