"""Environments of multi-turn episodes: a calculator tool and a verifier that asks for a retry.

An environment reads the text of each policy turn and either ends the episode with a reward or
answers with the text of an environment turn. It never raises on what the model wrote: a bad
tool call gets an error message as its answer, so a model can learn from it and the trainer
never sees an exception from model output.

- ``calculator``: a turn containing ``<calc>expression</calc>`` is a tool call, answered with
  ``<result>value</result>`` (or ``<error>why</error>``, see :mod:`.calculator`); a turn
  without one is the final answer, graded by the reward function. A policy turn is cut at its
  first ``</calc>`` (:attr:`Environment.stop`), so the model cannot invent the result.
- ``retry``: every turn is an answer; a correct one ends the episode with reward 1, a wrong one
  is answered with "wrong, try again" until the last turn.
"""

from __future__ import annotations

import asyncio
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from areal_m2po.reward.runner import extra_fields
from areal_m2po.reward.signature import check_reward_fn
from areal_m2po.rollout.workflows.multi_turn.calculator import CalculatorError, calculate

__all__ = [
    "ENVIRONMENTS",
    "Grader",
    "CalculatorEnvironment",
    "EnvReply",
    "Environment",
    "RetryEnvironment",
    "grader_from_fn",
    "make_environment",
]

CALC_OPEN, CALC_CLOSE = "<calc>", "</calc>"
_CALL_RE = re.compile(re.escape(CALC_OPEN) + r"(.*?)" + re.escape(CALC_CLOSE), re.DOTALL)

RewardFn = Callable[..., float]
Grader = Callable[[str], Awaitable[float]]
"""``await grade(answer_text)`` -> the reward of one answer of the episode's record."""


def grader_from_fn(record: Mapping[str, Any], reward_fn: RewardFn) -> Grader:
    """A grader calling ``reward_fn(prompt, completion, answer, **fields)`` or AReaL's
    ``reward_fn(prompt, completions, prompt_ids, completion_ids, answer, **fields)`` (in a
    worker thread; the answer's token ids are not known here: ``[]``); a reward function that
    raises or returns a non-finite value scores the answer 0."""
    prompt = str(record.get("prompt_text", record.get("question", "")))
    answer = str(record.get("answer", ""))
    call = check_reward_fn(reward_fn, "rollout.workflow_kwargs.reward_fn")
    extra = extra_fields(record)

    def score(text: str) -> float:
        args, kwargs = call.arguments(prompt, text, answer, extra, record.get("prompt_ids"))
        try:
            value = float(reward_fn(*args, **kwargs))
        except Exception:  # noqa: BLE001 - a reward crash on model text scores the answer 0
            return 0.0
        return value if math.isfinite(value) else 0.0

    async def grade(text: str) -> float:
        return await asyncio.to_thread(score, text)

    return grade


@dataclass(frozen=True)
class EnvReply:
    """What the environment does after one policy turn.

    Attributes:
        message: the text of the environment's turn, or None when the episode ends.
        reward: the episode's (undiscounted) reward; meaningful only when ``message`` is None.
        tool_call: whether the policy turn was a tool call (well-formed or not).
    """

    message: str | None
    reward: float = 0.0
    tool_call: bool = False


class Environment(ABC):
    """The other side of one episode; a new instance per episode (it may keep state)."""

    stop: tuple[str, ...] = ()
    """Strings at which a policy turn ends (kept in the turn), besides end-of-sequence."""

    def __init__(self, record: Mapping[str, Any], grade: Grader) -> None:
        self.record = record
        self.grade = grade

    @abstractmethod
    async def step(self, policy_text: str, last_turn: bool) -> EnvReply:
        """React to one policy turn's text; ``last_turn``: no further policy turn may follow."""


class CalculatorEnvironment(Environment):
    """Answers ``<calc>...</calc>`` tool calls; grades a turn without one."""

    stop = (CALC_CLOSE,)

    async def step(self, policy_text: str, last_turn: bool) -> EnvReply:
        match = _CALL_RE.search(policy_text)
        if match is None and CALC_OPEN not in policy_text:
            return EnvReply(None, await self.grade(policy_text))
        if last_turn:  # a tool call is never an answer
            return EnvReply(None, 0.0, tool_call=True)
        if match is None:
            return EnvReply(f"<error>{CALC_OPEN} without {CALC_CLOSE}</error>", tool_call=True)
        try:
            return EnvReply(f"<result>{calculate(match.group(1))}</result>", tool_call=True)
        except CalculatorError as exc:
            return EnvReply(f"<error>{exc}</error>", tool_call=True)


class RetryEnvironment(Environment):
    """A verifier: a wrong answer is answered with a request to try again."""

    retry_message = "Your answer is wrong. Try again; reply with only the number."

    async def step(self, policy_text: str, last_turn: bool) -> EnvReply:
        reward = await self.grade(policy_text)
        if reward > 0 or last_turn:
            return EnvReply(None, reward)
        return EnvReply(self.retry_message)


ENVIRONMENTS: dict[str, type[Environment]] = {
    "calculator": CalculatorEnvironment,
    "retry": RetryEnvironment,
}


def make_environment(name: str, record: Mapping[str, Any], grade: Grader) -> Environment:
    """A fresh environment ``name`` (one of :data:`ENVIRONMENTS`) for one episode's record."""
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(ENVIRONMENTS)}")
    return ENVIRONMENTS[name](record, grade)
