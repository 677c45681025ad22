"""The built-in single-turn workflow (``rollout.workflow=rlvr``): sample, decode, score.

For one record it issues ``gconfig.n_samples`` requests for the prompt at once, decodes each
completion (EOS and special tokens stripped), scores them with every reward source the config
names (:class:`~areal_m2po.rollout.rewards.RewardSources`: the verifiable function with the
record's other columns, the learned reward model, both weighted) and returns the group.
Subclass it and override :meth:`RLVRWorkflow.score` or :meth:`RLVRWorkflow.accept` for a
custom reward or filter (``examples/custom_workflow.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.rollout.rewards import GroupScores
from areal_m2po.rollout.token_text import decode_completion
from areal_m2po.utils.aio import gather_or_cancel

__all__ = ["RLVRWorkflow"]


class RLVRWorkflow(RolloutWorkflow):
    """``n_samples`` completions of one prompt, scored by the config's reward sources.

    Args:
        context: what the trainer provides (tokenizer, sampling, reward sources).
        n_samples: completions per prompt (default ``gconfig.n_samples``).
    """

    def __init__(self, context: WorkflowContext, n_samples: int | None = None) -> None:
        self.context = context
        self.n_samples = int(n_samples or context.gconfig.n_samples)

    async def arun_episode(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> TrajectoryGroup | None:
        req = ModelRequest(input_ids=list(record["prompt_ids"]), sampling=self.context.sampling)
        responses = await gather_or_cancel(
            *(
                engine.agenerate(ModelRequest(req.input_ids, req.sampling))
                for _ in range(self.n_samples)
            )
        )
        texts = [self.decode(r) for r in responses]
        scores = await self.score(record, responses, texts)
        group = TrajectoryGroup(
            [
                Trajectory.from_response(resp, reward)
                for resp, reward in zip(responses, scores.rewards)
            ],
            stats={**scores.stats, "timing/reward_s": scores.seconds},
        )
        for traj, info in zip(group.trajectories, scores.info):
            traj.info.update(info)
        return group if self.accept(group, texts) else None

    def decode(self, response: ModelResponse) -> str:
        """The completion's text."""
        return decode_completion(
            self.context.tokenizer, response.output_ids, self.context.eos_token_ids
        )

    async def score(
        self, record: dict[str, Any], responses: Sequence[ModelResponse], texts: Sequence[str]
    ) -> GroupScores:
        """Rewards of the group (default: every reward source of the config)."""
        return await self.context.reward.ascore([record] * len(texts), texts)

    def accept(self, group: TrajectoryGroup, texts: Sequence[str]) -> bool:
        """Whether to keep the group (default: always)."""
        return True

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        return dict(self.context.reward.finish_batch(groups))
