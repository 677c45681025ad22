"""Toy agents for the agent-workflow training test (``rollout.workflow_kwargs.agent``)."""

from __future__ import annotations

from typing import Any

import openai


async def two_turn_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """Asks twice in one conversation; the reward is the share of digits in the answers."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": record["question"]}]
    texts = []
    for follow_up in ("Are you sure?", None):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        message = reply.choices[0].message
        texts.append(message.content or "")
        if follow_up is not None:
            messages += [message, {"role": "user", "content": follow_up}]
    joined = "".join(texts)
    return sum(ch.isdigit() for ch in joined) / max(1, len(joined))


async def gated_two_turn_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """:func:`two_turn_agent` once the file named by ``$AGENT_GATE`` exists (the flood test
    opens its gate when its flood is in place; at most 300 s)."""
    import asyncio
    import os
    import time

    deadline = time.monotonic() + 300
    while not os.path.exists(os.environ["AGENT_GATE"]):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {os.environ['AGENT_GATE']} never opened")
        await asyncio.sleep(0.1)
    return await two_turn_agent(base_url, api_key, record)


class DefaultClientAgent:
    """AReaL's ``mode: subproc`` contract with the client docs/agents.md names: a default
    ``openai.AsyncOpenAI()`` (from ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``), never closed.
    Each episode first collects garbage, as a busy agent's allocations would, so the last
    episode's client is finalised now, in this episode's event loop."""

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        import gc

        gc.collect()
        client = openai.AsyncOpenAI()
        reply = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": data["question"]}]
        )
        text = reply.choices[0].message.content or ""
        return sum(ch.isdigit() for ch in text) / max(1, len(text))
