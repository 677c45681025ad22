"""The multi-turn workflow: the policy answers, an environment replies, up to ``max_turns``.

Built in as ``rollout.workflow=multi_turn``; its settings come from ``rollout.workflow_kwargs``:

- ``environment``: ``calculator`` (tool calls ``<calc>expr</calc>`` answered with the result)
  or ``retry`` (a verifier asking for another try after a wrong answer); see
  :mod:`areal_m2po.rollout.workflows.multi_turn.tool_env`.
- ``max_turns``: policy turns per episode at most (>= 1).
- ``turn_discount``: the episode's reward is ``reward * turn_discount ** (turns - 1)`` (AReaL's
  ``turn_discount``: 1 = no discount).
- ``max_total_tokens``: the whole episode's length at most (prompt, every turn); null: only
  ``max_turns`` and ``gconfig.max_new_tokens`` per turn bound it.
- ``env_role``: role of the environment's turns in the chat template (``user``, or ``tool`` for
  templates that know it).
- ``reward_fn``: dotted path (or, from Python, the callable) of the reward function grading an
  answer (``fn(prompt, completion, answer) -> float``); null: the config's verifiable reward
  (``reward.path``, run by the trainer's reward runner with its timeouts), or the math reward
  when the trainer gives none. A learned reward (``reward.model``) is not supported here: it
  scores single completions and normalises over the batch, which would overwrite the
  per-turn discount.

Every episode is one trajectory: the exact token sequence the engine saw, with the policy's
tokens in the loss mask (each with its behaviour log-prob and version) and the environment's
tokens out of it; its turns go to the engine under one request id (one server of a remote
engine, whose prefix cache holds the episode). The ``gconfig.n_samples`` episodes of a record,
which the executor runs at once, form its group.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, SamplingParams
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.reward.math_reward import math_reward_fn
from areal_m2po.reward.runner import load_reward_fn
from areal_m2po.rollout.workflows.multi_turn.chat_turns import TurnAppender
from areal_m2po.rollout.workflows.multi_turn.episode import EpisodeTokens, Generated, run_episode
from areal_m2po.rollout.workflows.multi_turn.tool_env import (
    ENVIRONMENTS,
    Grader,
    grader_from_fn,
    make_environment,
)

__all__ = ["MultiTurnWorkflow"]

_KEY = "rollout.workflow_kwargs"


class MultiTurnWorkflow(RolloutWorkflow):
    """Episodes of alternating policy and environment turns (see the module doc).

    The trainer's held-out evaluation runs one greedy episode per record (:meth:`aevaluate`):
    ``eval/accuracy`` is the episodes' success rate, with ``eval/tool_use_fraction``,
    ``eval/second_turn_fraction`` and ``eval/turns_mean``.

    Raises:
        ValueError: one line naming the ``rollout.workflow_kwargs`` key that is wrong.
    """

    eval_metrics = ("tool_use_fraction", "second_turn_fraction", "turns_mean")

    def __init__(
        self,
        context: WorkflowContext,
        environment: str = "calculator",
        max_turns: int = 3,
        turn_discount: float = 1.0,
        max_total_tokens: int | None = None,
        env_role: str = "user",
        reward_fn: str | Callable[..., float] | None = None,
        use_chat_template: bool = True,
    ) -> None:
        if environment not in ENVIRONMENTS:
            raise ValueError(
                f"{_KEY}.environment: {environment!r} is not one of {', '.join(ENVIRONMENTS)}"
            )
        if not (isinstance(max_turns, int) and max_turns >= 1):
            raise ValueError(f"{_KEY}.max_turns: must be an integer >= 1, got {max_turns!r}")
        if not 0 < float(turn_discount) <= 1:
            raise ValueError(f"{_KEY}.turn_discount: must be in (0, 1], got {turn_discount!r}")
        if max_total_tokens is not None and not (
            isinstance(max_total_tokens, int) and max_total_tokens >= 2
        ):
            raise ValueError(f"{_KEY}.max_total_tokens: must be an integer >= 2 or null")
        self.context = context
        self.environment = environment
        self.max_turns = max_turns
        self.turn_discount = float(turn_discount)
        self.max_total_tokens = max_total_tokens if max_total_tokens is not None else sys.maxsize
        self.reward_fn: Callable[..., float] | None = None
        if callable(reward_fn):
            self.reward_fn = reward_fn
        elif reward_fn is not None:
            self.reward_fn = load_reward_fn(reward_fn, f"{_KEY}.reward_fn")
        elif context.reward is None:
            self.reward_fn = math_reward_fn
        if getattr(context.reward, "learned", None) is not None:
            raise ValueError(
                "reward.model: the multi_turn workflow grades answers with the verifiable "
                "reward only (reward.path or rollout.workflow_kwargs.reward_fn)"
            )
        try:
            self.appender = TurnAppender(context.tokenizer, env_role, use_chat_template)
        except Exception as exc:  # noqa: BLE001 - a template that cannot render the role
            raise ValueError(
                f"{_KEY}.env_role: the chat template cannot render role {env_role!r} "
                f"({type(exc).__name__}: {exc})"
            ) from None
        self.appender.eos_ids |= set(context.eos_token_ids)

    async def _generate(
        self,
        engine: InferenceEngine,
        base: SamplingParams,
        ids: list[int],
        budget: int,
        stop: Sequence[str],
        rid: str,
    ) -> Generated:
        sampling = dataclasses.replace(
            base,
            max_new_tokens=budget,
            min_new_tokens=min(base.min_new_tokens, budget),
            stop=tuple(dict.fromkeys((*base.stop, *stop))),
        )
        out = await engine.agenerate(ModelRequest(input_ids=ids, sampling=sampling, rid=rid))
        return Generated(
            list(out.output_ids),
            list(out.output_logprobs),
            list(out.output_versions),
            out.finish_reason,
        )

    def _grader(self, record: dict[str, Any]) -> Grader:
        if self.reward_fn is not None:
            return grader_from_fn(record, self.reward_fn)
        sources = self.context.reward

        async def grade(text: str) -> float:
            rewards, _ = await asyncio.to_thread(sources.score_verifiable, [record], [text])
            return float(rewards[0])

        return grade

    async def _episode(
        self, engine: InferenceEngine, record: dict[str, Any], sampling: SamplingParams
    ) -> tuple[EpisodeTokens, float, str]:
        env = make_environment(self.environment, record, self._grader(record))
        finish: list[str] = []
        rid = uuid.uuid4().hex  # every turn of the episode: one request id, one server

        async def generate(ids: list[int], budget: int, stop: Sequence[str]) -> Generated:
            out = await self._generate(engine, sampling, ids, budget, stop, rid)
            finish.append(out.finish_reason)
            return out

        episode, reward = await run_episode(
            generate,
            env,
            self.appender,
            record["prompt_ids"],
            self.max_turns,
            self.context.gconfig.max_new_tokens,
            self.max_total_tokens,
        )
        return episode, reward, finish[-1]

    def _check_room(self, record: dict[str, Any]) -> int:
        prompt_len = len(record["prompt_ids"])
        if prompt_len >= self.max_total_tokens:
            raise ValueError(
                f"{_KEY}.max_total_tokens: {self.max_total_tokens} leaves no room after a "
                f"{prompt_len}-token prompt"
            )
        return prompt_len

    async def aevaluate(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> dict[str, float] | None:
        """One greedy episode of ``record``: ``correct`` (its reward before the discount
        exceeds 0.5), ``tool_use_fraction`` (it made a tool call), ``second_turn_fraction``
        (the policy took a second turn) and ``turns_mean`` (its policy turns)."""
        self._check_room(record)
        greedy = dataclasses.replace(self.context.sampling, temperature=0.0)
        episode, reward, finish = await self._episode(engine, record, greedy)
        if finish == "abort":
            raise RuntimeError("the engine aborted a greedy evaluation episode")
        return {
            "correct": float(reward > 0.5),
            "tool_use_fraction": float(episode.tool_calls > 0),
            "second_turn_fraction": float(episode.policy_turns > 1),
            "turns_mean": float(episode.policy_turns),
        }

    def _trajectory(
        self, prompt_len: int, episode: EpisodeTokens, reward: float, finish: str
    ) -> Trajectory:
        discounted = reward * self.turn_discount ** (episode.policy_turns - 1)
        return Trajectory(
            input_ids=episode.input_ids,
            loss_mask=episode.loss_mask,
            logprobs=episode.logprobs,
            versions=episode.versions,
            prompt_len=prompt_len,
            reward=discounted,
            no_eos=finish != "stop",
            info={
                "turns": episode.policy_turns,
                "tool_calls": episode.tool_calls,
                "raw_reward": reward,
                "turn_texts": episode.turn_texts,
            },
        )

    async def arun_episode(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> Trajectory | None:
        """One episode of ``record``; None (the group dropped) when the engine aborted it."""
        prompt_len = self._check_room(record)
        episode, reward, finish = await self._episode(engine, record, self.context.sampling)
        if finish == "abort":
            return None
        return self._trajectory(prompt_len, episode, reward, finish)

    async def afinish_group(
        self, record: dict[str, Any], trajectories: list[Trajectory]
    ) -> TrajectoryGroup:
        """The group, with the counts of its episodes' turns, tool calls and successes."""
        stats = {
            "multi_turn/episodes": float(len(trajectories)),
            "multi_turn/turns": float(sum(t.info["turns"] for t in trajectories)),
            "multi_turn/tool_calls": float(sum(t.info["tool_calls"] for t in trajectories)),
            "multi_turn/tool_episodes": float(sum(t.info["tool_calls"] > 0 for t in trajectories)),
            "multi_turn/multi_turn_episodes": float(sum(t.info["turns"] > 1 for t in trajectories)),
            "multi_turn/solved_episodes": float(
                sum(t.info["raw_reward"] > 0 for t in trajectories)
            ),
        }
        return TrajectoryGroup(trajectories, stats)
