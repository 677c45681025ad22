"""The built-in single-turn workflow (``rollout.workflow=rlvr``): sample, decode, score.

Each episode samples one completion of the prompt (the executor runs ``gconfig.n_samples`` of
them at once); the group's completions are then decoded (EOS and special tokens stripped) and
scored together with every reward source the config names
(:class:`~areal_m2po.rollout.rewards.RewardSources`: the verifiable function with the record's
other columns, the learned reward model, both weighted).
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

__all__ = ["RESPONSE", "RLVRWorkflow"]

RESPONSE = "rlvr/response"
"""``Trajectory.info`` key of an episode's :class:`ModelResponse` until its group is scored."""


class RLVRWorkflow(RolloutWorkflow):
    """One completion of the prompt per episode; the group scored together by the config's
    reward sources.

    Args:
        context: what the trainer provides (tokenizer, sampling, reward sources).
    """

    def __init__(self, context: WorkflowContext) -> None:
        self.context = context

    async def arun_episode(self, engine: InferenceEngine, record: dict[str, Any]) -> Trajectory:
        """One sampled completion of the prompt (reward 0 until :meth:`afinish_group` scores
        it; its response is kept in ``info[RESPONSE]`` until then), within the episode budget
        (the config check makes every kept prompt and ``gconfig.max_new_tokens`` fit).

        Raises:
            ValueError: the prompt leaves no room in the episode budget.
        """
        prompt = list(record["prompt_ids"])
        sampling = self.context.turn_sampling(len(prompt))
        if sampling is None:
            raise ValueError(
                f"rollout.max_episode_tokens: {self.context.max_episode_tokens} leaves no room "
                f"after a {len(prompt)}-token prompt"
            )
        request = ModelRequest(input_ids=prompt, sampling=sampling)
        response = await engine.agenerate(request)
        trajectory = Trajectory.from_response(response)
        trajectory.info[RESPONSE] = response
        return trajectory

    async def afinish_group(
        self, record: dict[str, Any], trajectories: list[Trajectory]
    ) -> TrajectoryGroup | None:
        """Decode and score the group's completions in one :meth:`score` call; keep it if
        :meth:`accept` says so."""
        responses = [t.info.pop(RESPONSE) for t in trajectories]
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
        ids = [list(r.output_ids) for r in responses]
        return await self.context.reward.ascore([record] * len(texts), texts, ids)

    def accept(self, group: TrajectoryGroup, texts: Sequence[str]) -> bool:
        """Whether to keep the group (default: always)."""
        return True

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        return dict(self.context.reward.finish_batch(groups))
