"""The agent endpoint's prompts: a call's messages rendered with the tokenizer's chat template,
built on an earlier call's tokens when the call extends it (token-in/token-out: nothing the
engine generated is re-tokenised). Runs in the endpoint's worker thread, off its event loop."""

from __future__ import annotations

import json
from typing import Any

from areal_m2po.rollout.openai.chat_request import (
    ChatRequest,
    ChatRequestError,
    normalise_assistant,
)
from areal_m2po.rollout.token_text import encode_text

__all__ = ["PromptBuilder"]

_SENTINEL = "\u2063ASSISTANT_SENTINEL\u2063"


class PromptBuilder:
    """Renders requests with the tokenizer's chat template; extends earlier calls' tokens."""

    def __init__(self, tokenizer: Any, eos_ids: set[int]) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the agent endpoint needs a tokenizer with a chat template")
        text = self.render(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}],
            None,
            False,
        )
        self.assistant_close = text[text.index(_SENTINEL) + len(_SENTINEL) :]
        eos_text = tokenizer.eos_token or ""
        self.close_after_eos = (
            self.assistant_close[len(eos_text) :]
            if eos_text and self.assistant_close.startswith(eos_text)
            else self.assistant_close
        )

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        generation_prompt: bool,
        **template_kwargs: Any,
    ) -> str:
        """The chat template's text of ``messages`` (``template_kwargs``: the template's own
        variables, such as ``enable_thinking``)."""
        rendered = []
        for m in messages:  # templates take tool-call arguments as objects
            if m.get("tool_calls"):
                m = {**m, "tool_calls": [_with_object_arguments(c) for c in m["tool_calls"]]}
            rendered.append(m)
        try:
            return self.tokenizer.apply_chat_template(
                rendered,
                tools=tools,
                add_generation_prompt=generation_prompt,
                tokenize=False,
                **template_kwargs,
            )
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise ChatRequestError(
                "messages", f"the chat template cannot render them ({exc})"
            ) from None

    def build(self, request: ChatRequest, calls: list[Any]) -> tuple[list[int], int | None]:
        """(prompt ids, index of the call they extend or None); ``calls`` are the session's
        :class:`~areal_m2po.rollout.openai.endpoint.CallRecord` so far."""
        full = self.render(request.messages, request.tools, True)
        for index in range(len(calls) - 1, -1, -1):
            call = calls[index]
            k = len(call.messages)
            if (
                len(request.messages) > k
                and request.tools == call.tools
                and request.messages[:k] == call.messages
                and request.messages[k]["role"] == "assistant"
                and normalise_assistant(request.messages[k]) == normalise_assistant(call.reply)
            ):
                prefix = self.render(request.messages[: k + 1], request.tools, False)
                if not full.startswith(prefix):
                    continue
                ended_with_eos = (
                    bool(call.completion_ids) and call.completion_ids[-1] in self.eos_ids
                )
                glue = self.close_after_eos if ended_with_eos else self.assistant_close
                tail = encode_text(self.tokenizer, glue + full[len(prefix) :])
                return call.prompt_ids + call.completion_ids + tail, index
        return encode_text(self.tokenizer, full), None


def _with_object_arguments(call: dict[str, Any]) -> dict[str, Any]:
    arguments = call["function"]["arguments"]
    try:
        parsed = json.loads(arguments)
    except (TypeError, ValueError, RecursionError):
        parsed = arguments
    return {**call, "function": {**call["function"], "arguments": parsed}}
