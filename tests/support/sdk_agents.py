"""Agents written against the OpenAI Agents SDK in AReaL's contract (``async run(data,
**extra_kwargs)`` with ``base_url``, ``api_key``, ``http_client``), for the tests: a
calculator agent with a function tool, and AReaL's handoff math agent
(``tests/data/areal/agents/math_agent.py``, vendored unchanged) run as AReaL's
``examples/openai_agents`` runs it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import openai
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)

from areal_m2po.rollout.workflows.multi_turn.calculator import CalculatorError, calculate

VENDORED = Path(__file__).resolve().parents[1] / "data" / "areal" / "agents"


@function_tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    try:
        return calculate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"


def digit_fraction(text: str) -> float:
    """The share of digits in ``text`` (a dense toy reward a random model varies on)."""
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def _client(extra_kwargs: dict[str, Any]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=extra_kwargs["base_url"],
        api_key=extra_kwargs["api_key"],
        http_client=extra_kwargs["http_client"],
        max_retries=0,
    )


async def _run(agent: Agent, question: str, config: RunConfig, stream: bool) -> Any:
    if not stream:
        return await Runner.run(agent, question, run_config=config, max_turns=4)
    result = Runner.run_streamed(agent, question, run_config=config, max_turns=4)
    async for _ in result.stream_events():
        pass
    return result


class SdkToolAgent:
    """An ``Agent`` with the ``calc`` function tool on the Responses API; the reward, keyed by
    the last response's id, is the digit share of the final output (the first response gets
    ``first_reward`` of its own)."""

    api = "responses"
    stream = False
    first_reward = 0.0

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> Any:
        client = _client(extra_kwargs)
        if self.api == "responses":
            model: Any = OpenAIResponsesModel("policy", client)
        else:
            model = OpenAIChatCompletionsModel("policy", client)
        agent = Agent(
            name="calculator",
            instructions="Answer with a number. Use the calc tool for arithmetic.",
            tools=[calc],
            model=model,
        )
        config = RunConfig(tracing_disabled=True)
        result = await _run(agent, data["question"], config, self.stream)
        reward = digit_fraction(str(result.final_output or ""))
        ids = [r.response_id for r in result.raw_responses]
        if self.api != "responses":  # the chat model reports no response ids
            return float(reward)
        rewards = {ids[-1]: reward}
        if len(ids) > 1:
            rewards[ids[0]] = self.first_reward
        return rewards


class SdkChatToolAgent(SdkToolAgent):
    api = "chat"


class SdkStreamedToolAgent(SdkToolAgent):
    stream = True


class ArealMathAgent:
    """AReaL's handoff math agent (vendored ``build_math_agent``), through the SDK's
    ``OpenAIProvider`` on the client the trainer hands over, as AReaL's example runs it."""

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        if str(VENDORED) not in sys.path:
            sys.path.insert(0, str(VENDORED))
        math_agent = importlib.import_module("math_agent")
        config = RunConfig(
            model_provider=OpenAIProvider(openai_client=_client(extra_kwargs)),
            tracing_disabled=True,
        )
        result = await Runner.run(
            math_agent.build_math_agent(), data["question"], run_config=config, max_turns=4
        )
        self.last_agent = result.last_agent.name
        return float(digit_fraction(str(result.final_output or "")))


class EnvClientAgent:
    """AReaL's ``mode: subproc`` contract: ``run(data)`` only, its client built from
    ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``; returns its worker's pid with the reward (the
    test checks it ran in another process)."""

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        import os

        assert not extra_kwargs  # subproc passes the session through the environment only
        client = openai.AsyncOpenAI(max_retries=0)
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": data["question"]}]
        )
        with open(data["pid_file"], "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))
        return {reply.id: digit_fraction(reply.choices[0].message.content or "")}
