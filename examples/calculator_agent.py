"""An agent trained through the OpenAI-compatible endpoint: it gives the model a calculator.

The trainer calls ``calculator_agent(base_url, api_key, record)`` once per episode. The agent
is ordinary ``openai`` client code: it asks the model, runs the calculator whenever the model
asks for it (as an OpenAI tool call, or with the ``<calc>...</calc>`` tag of the built-in
multiplication task, for templates that render no tools, such as SmolLM2's), sends the result
back, and returns the episode's reward. Train with it (from the repository root)::

    PYTHONPATH=examples python -m areal_m2po.train --config examples/agent.yaml

Every call's prompt extends the previous one (the agent sends the conversation back with the
reply it got), so each episode is one trajectory with the model's turns in the loss mask.
"""

from __future__ import annotations

import json
import re
from typing import Any

import openai

from areal_m2po.reward.math_reward import math_reward_fn
from areal_m2po.rollout.workflows.multi_turn.calculator import CalculatorError, calculate

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
MAX_CALLS = 3
_TAG = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


def run_calc(expression: str) -> str:
    """The calculator's answer, or its error message (the model reads either)."""
    try:
        return calculate(expression)
    except CalculatorError as exc:
        return f"error: {exc}"


async def calculator_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """Up to ``MAX_CALLS`` model calls; 1.0 when the final answer is ``record["answer"]``."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": record["question"]}]
    answer = ""
    for _ in range(MAX_CALLS):
        response = await client.chat.completions.create(
            model="policy", messages=messages, tools=[CALC_TOOL], stop=["</calc>"]
        )
        message = response.choices[0].message
        messages.append(message)
        if message.tool_calls:  # an OpenAI tool call (templates that render tools)
            for call in message.tool_calls:
                expression = json.loads(call.function.arguments).get("expression", "")
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": run_calc(str(expression))}
                )
            continue
        text = message.content or ""
        tag = _TAG.search(text)  # the stop string ends the reply right after </calc>
        if tag is None:  # no tool wanted: this is the answer
            answer = text
            break
        messages.append({"role": "user", "content": f"<result>{run_calc(tag.group(1))}</result>"})
    return math_reward_fn(record["question"], answer, record["answer"])
