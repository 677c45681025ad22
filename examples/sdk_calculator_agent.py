"""An OpenAI Agents SDK agent with a function tool, in AReaL's agent contract, for the
Agents-SDK demo (``examples/agents_sdk_demo.py``, ``configs/agents_sdk_demo.yaml``).

The agent is what an SDK user writes: an ``Agent`` with the ``calc`` ``function_tool``,
run by ``Runner.run`` on the client the trainer hands over (``base_url``, ``api_key``,
``http_client``), on the Responses API. Its question is the ``builtin:multiplication``
problem without the multi-turn workflow's ``<calc>`` convention (``What is 347 * 58?``); the
instructions describe the tool and its call format, because SmolLM2's chat template does not
render the ``tools`` it is given. The model calls the tool in the Hermes / Qwen format
(``<tool_call>{"name": "calc", "arguments": {"expression": "347*58"}}</tool_call>``), which the
endpoint parses into a function call (``rollout.agent.tool_call_parser: hermes``).

The reward is 1.0 when the final output states the product, else 0.0; a run the SDK ends with
an error (more than ``MAX_TURNS`` model calls, an unknown tool name) scores 0.0 and is trained
on, rather than dropped.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from agents.exceptions import AgentsException

from areal_m2po.reward.math_reward import math_reward_fn
from areal_m2po.rollout.workflows.multi_turn.calculator import CalculatorError, calculate

__all__ = ["INSTRUCTIONS", "MAX_TURNS", "SdkCalculatorAgent", "question_of", "tool_call_text"]

MAX_TURNS = 3
INSTRUCTIONS = (
    "You can use one tool, calc, which evaluates an arithmetic expression. To call it, reply "
    'with only <tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call> '
    "(with your expression). You will get the result; then reply with only the number."
)
_QUESTION = re.compile(r"What is (\d+) \* (\d+)\?")


def question_of(record: dict[str, Any]) -> str:
    """``What is A * B?`` of a ``builtin:multiplication`` record (its tool hint left out)."""
    match = _QUESTION.match(str(record["question"]))
    if match is None:
        raise ValueError(f"not a builtin:multiplication question: {record['question']!r:.80}")
    return match.group(0)


def tool_call_text(expression: str) -> str:
    """The assistant's tool call for ``expression`` in the Hermes format the parser reads."""
    call = {"name": "calc", "arguments": {"expression": expression}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


@function_tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses."""
    try:
        return calculate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"


class SdkCalculatorAgent:
    """``Runner.run`` of an ``Agent`` with ``calc``; returns the episode's reward (a float:
    the reward of its last interaction, AReaL's contract)."""

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        client = openai.AsyncOpenAI(
            base_url=extra_kwargs["base_url"],
            api_key=extra_kwargs["api_key"],
            http_client=extra_kwargs["http_client"],
            max_retries=0,
        )
        agent = Agent(
            name="calculator",
            instructions=INSTRUCTIONS,
            tools=[calc],
            model=OpenAIResponsesModel("policy", client),
        )
        config = RunConfig(tracing_disabled=True)
        try:
            result = await Runner.run(
                agent, question_of(data), run_config=config, max_turns=MAX_TURNS
            )
        except AgentsException:  # too many turns, an unknown tool: a failed episode
            return 0.0
        return math_reward_fn("", str(result.final_output or ""), str(data["answer"]))
