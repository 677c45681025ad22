"""AReaL's single-call math agent (``areal.workflow.openai.math_agent.MathAgent`` at
areal-project/AReaL cbff54d6), in AReaL's agent contract: ``await agent.run(data,
base_url=..., api_key=..., http_client=...)`` asks the policy once through the OpenAI client
(this package's agent endpoint, :mod:`areal_m2po.rollout.workflows.agent`) and returns the
``math_verify`` reward of the reply against ``data["answer"]``
(:func:`~areal_m2po.areal.reward.math_verify.get_math_verify_worker`).
"""

from __future__ import annotations

import os
from typing import Any

from areal_m2po.areal.api.reward_api import AsyncRewardWrapper
from areal_m2po.areal.reward.math_verify import get_math_verify_worker

__all__ = ["MathAgent", "math_reward_fn"]


def math_reward_fn(completions: str, answer: str) -> float:
    """1.0 when ``completions``' final answer equals ``answer``'s, else 0.0."""
    return get_math_verify_worker().verify(str(completions), str(answer))


class MathAgent:
    """Sends ``data["messages_chat"]`` (or ``data["messages"]``; a string is one user turn)
    with the constructor's keywords as the request's sampling arguments.

    AReaL's handling of the length keywords: ``max_new_tokens`` becomes ``max_tokens`` unless
    that is given; without ``max_new_tokens``, ``max_tokens`` is dropped (so
    ``max_completion_tokens`` bounds the reply); ``max_turns`` is dropped.
    """

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = dict(kwargs)
        max_new_tokens = self.kwargs.pop("max_new_tokens", None)
        self.kwargs.pop("max_turns", None)
        if max_new_tokens is not None and "max_tokens" not in self.kwargs:
            self.kwargs["max_tokens"] = max_new_tokens
        else:
            self.kwargs.pop("max_tokens", None)
        self._reward_fn = AsyncRewardWrapper(math_reward_fn)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(
            base_url=extra_kwargs.get("base_url") or os.getenv("OPENAI_BASE_URL"),
            api_key=extra_kwargs.get("api_key") or os.getenv("OPENAI_API_KEY"),
            http_client=extra_kwargs.get("http_client"),
            max_retries=0,
        )
        messages = data.get("messages_chat") or data["messages"]
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        completion = await client.chat.completions.create(
            messages=messages, model="default", **self.kwargs
        )
        text = completion.choices[0].message.content or ""
        return float(await self._reward_fn(completions=text, answer=data["answer"]))
