"""AReaL's retry workflow (``areal.workflow.multi_turn.MultiTurnWorkflow`` at
areal-project/AReaL cbff54d6), run by this package's multi-turn loop
(:func:`~areal_m2po.rollout.workflows.multi_turn.episode.run_episode`).

An episode answers the record's ``messages``; while the reward is 0 and fewer than
``max_turns`` answers were given, the answer (closed with EOS when it did not end with one)
is followed by AReaL's feedback turn (a user message saying the answer is wrong, then the
assistant header: the chat template's tokens after an assistant turn) and answered again.
The reward, AReaL's call ``reward_fn(prompt, completions, prompt_ids, completion_ids,
**data)`` on the last answer, is discounted by ``turn_discount ** (turns - 1)``. The episode
is one row of AReaL's tensor dict: the whole sequence, answers in the loss mask, the
feedback turns out of it, with AReaL's ``turn_ids``.

Unlike AReaL, the episode keeps to the trainer's episode budget (``rollout.max_episode_tokens``,
and ``gconfig.max_tokens``): an answer gets at most the tokens left, and an episode with no
room for the feedback turn ends there with reward 0 (the package's loop's rule).
"""

from __future__ import annotations

import math
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch

from areal_m2po.areal.api.generation import GenerationHyperparameters
from areal_m2po.areal.api.io_struct import ModelRequest, ModelResponse
from areal_m2po.areal.api.workflow_api import RolloutWorkflow
from areal_m2po.areal.infra import workflow_context
from areal_m2po.areal.utils import stats_tracker
from areal_m2po.areal.utils.hf_utils import apply_chat_template
from areal_m2po.areal.workflow._episode import LazyReward, episode_tensors, generated
from areal_m2po.rollout.workflows.multi_turn.episode import Generated, run_episode
from areal_m2po.rollout.workflows.multi_turn.tool_env import Environment, EnvReply

__all__ = ["FEEDBACK", "MultiTurnWorkflow"]

FEEDBACK = (
    "Your answer is either wrong or not parsable to the reward function. You may misunderstand "
    "the original question. Please carefully read the original question, check the previous "
    "errors, and try to answer it again."
)
"""The user turn after a wrong answer (AReaL's text)."""


class _Retry(Environment):
    """AReaL's verifier: the reward of each answer; another try while it is 0."""

    def __init__(self, data: dict[str, Any], workflow: MultiTurnWorkflow) -> None:
        super().__init__(data, None)  # type: ignore[arg-type]  # grades in step
        self.workflow = workflow
        self.last: ModelResponse | None = None
        self.reward: Any = 0.0

    async def step(self, policy_text: str, last_turn: bool) -> EnvReply:
        resp, tok = self.last, self.workflow.tokenizer
        assert resp is not None, "step follows a generation"
        self.reward = await self.workflow.async_reward_fn(
            tok.decode(resp.input_tokens),
            tok.decode(resp.output_tokens),
            resp.input_tokens,
            resp.output_tokens,
            **self.record,
        )
        if self.reward != 0.0 or last_turn:
            return EnvReply(None, float(self.reward))
        return EnvReply(FEEDBACK)


class _FeedbackTokens:
    """The tokens after a wrong answer: EOS unless the answer ended with it, then AReaL's
    feedback turn (what the loop's appender gives, AReaL's way)."""

    def __init__(self, tokenizer: Any, feedback_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = {tokenizer.eos_token_id}
        self.feedback_ids = feedback_ids

    def ids(self, content: str, policy_ended_with_eos: bool) -> list[int]:
        eos = [] if policy_ended_with_eos else [self.tokenizer.eos_token_id]
        return eos + self.feedback_ids


def feedback_ids(tokenizer: Any) -> list[int]:
    """The chat template's tokens of the feedback turn and the next assistant header: those
    after an assistant turn (its own tokens, so no answer is re-tokenised)."""
    messages = [{"role": "assistant", "content": "some random message."}]
    before = apply_chat_template(tokenizer, messages, tokenize=True)
    messages.append({"role": "user", "content": FEEDBACK})
    after = apply_chat_template(tokenizer, messages, tokenize=True, add_generation_prompt=True)
    return list(after[len(before) :])


class MultiTurnWorkflow(RolloutWorkflow):
    """Answers until one is rewarded (see the module doc).

    Args:
        reward_fn: AReaL's reward signature (or its dotted path).
        gconfig: sampling of each answer; the tokenizer's pad and EOS ids are added as stop
            tokens.
        tokenizer: the policy's tokenizer (its chat template renders the feedback turn).
        max_turns: answers at most (> 0).
        turn_discount: the reward's factor per retry, in (0, 1].

    Raises:
        ValueError: ``max_turns`` or ``turn_discount`` out of range.
    """

    def __init__(
        self,
        reward_fn: Callable[..., Any] | str,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        max_turns: int,
        turn_discount: float,
    ) -> None:
        if max_turns <= 0:
            raise ValueError("max_turns must be positive")
        if not 0.0 < turn_discount <= 1.0:
            raise ValueError("turn_discount must be in (0, 1].")
        self.reward_fn = reward_fn
        self.async_reward_fn = LazyReward(reward_fn)
        self.gconfig = GenerationHyperparameters.of(gconfig).new_with_stop_and_pad_token_ids(
            tokenizer
        )
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.turn_discount = turn_discount
        self.multi_turn_prompt_ids = feedback_ids(tokenizer)

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The episode's tensor dict, one row with ``turn_ids``."""
        env = _Retry(data, self)
        turn_lens: list[int] = []

        async def generate(ids: list[int], budget: int, stop: Sequence[str]) -> Generated:
            req = ModelRequest(
                rid=uuid.uuid4().hex,
                input_ids=ids,
                gconfig=self.gconfig.new(n_samples=1, max_new_tokens=budget),
                tokenizer=self.tokenizer,
            )
            env.last = resp = await engine.agenerate(req)
            turn_lens.append(resp.output_len)
            return generated(resp)

        prompt = apply_chat_template(
            self.tokenizer, data["messages"], tokenize=True, add_generation_prompt=True
        )
        limits = [self.gconfig.max_tokens, workflow_context.get().max_episode_tokens]
        episode, _ = await run_episode(
            generate,
            env,
            _FeedbackTokens(self.tokenizer, self.multi_turn_prompt_ids),  # type: ignore[arg-type]
            prompt,
            self.max_turns,
            self.gconfig.max_new_tokens,
            min([t for t in limits if t is not None], default=sys.maxsize),
        )
        turns = episode.policy_turns
        reward = float(env.reward * math.prod([self.turn_discount] * (turns - 1)))
        stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward, num_turns=turns)
        return episode_tensors(episode, reward, turn_lens)
