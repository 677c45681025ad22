"""The chat-completions request fields the agent endpoint honours, checks and refuses.

:func:`parse_chat_request` turns the JSON body the ``openai`` client sends to
``POST /v1/chat/completions`` into a :class:`ChatRequest`, or raises :class:`ChatRequestError`
(answered with HTTP 400 and the message in OpenAI's error shape). Nothing is silently ignored:
a field is used, checked against the trainer's settings, or refused.

Tool calls in a completion are read by the parser ``rollout.agent.tool_call_parser`` names
(:mod:`.tool_parsers`; ``parse_tool_calls`` here is its Hermes/Qwen one, ``<tool_call>{"name":
..., "arguments": {...}}</tool_call>``). A completion is data: parsing never raises, whatever
the model wrote (a malformed call, a thousand nested brackets, a lone surrogate escape); what is
not a well-formed call stays in the text.

A call is bounded before it is worked on (:mod:`.limits`): at most ``MAX_MESSAGES`` messages
and ``MAX_CALL_CHARS`` characters of text, every string valid Unicode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from areal_m2po.rollout.openai.limits import (
    MAX_CALL_CHARS,
    MAX_MESSAGES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    check_unicode,
    shown,
)
from areal_m2po.rollout.openai.tool_parsers import parse_hermes as parse_tool_calls

__all__ = [
    "ACCEPTED_FIELDS",
    "REFUSED_FIELDS",
    "ChatRequest",
    "ChatRequestError",
    "normalise_assistant",
    "parse_chat_request",
    "parse_tool_calls",
]

ROLES = ("system", "developer", "user", "assistant", "tool")
ACCEPTED_FIELDS = (
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "n",
    "stop",
    "stream",
    "frequency_penalty",
    "presence_penalty",
    "user",
)
"""Fields read (``model`` and ``user`` are informational: any string is accepted)."""
REFUSED_FIELDS = (
    "seed",
    "logit_bias",
    "response_format",
    "stream_options",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "service_tier",
    "store",
    "metadata",
    "functions",
    "function_call",
    "web_search_options",
)
"""Fields of the chat-completions API refused with HTTP 400 whenever present (any other unknown
field is refused too)."""


class ChatRequestError(ValueError):
    """A request the endpoint refuses; ``param`` names the field (HTTP 400)."""

    def __init__(self, param: str | None, message: str) -> None:
        if param is not None:  # a field's name may be any string the client sent
            param = shown(param, 80, quote=False)
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param


@dataclass
class ChatRequest:
    """A checked request.

    Attributes:
        messages: normalised messages (``role``, ``content`` text, and ``tool_calls`` /
            ``tool_call_id`` / ``name`` where given), as the chat template takes them.
        tools: the ``tools`` list for the chat template, or None.
        max_new_tokens: ``max_completion_tokens`` / ``max_tokens``, or None (the default).
        stop: stop strings.
        logprobs: whether to return the sampled tokens' log-probs.
        tool_choice: ``auto`` or ``none`` (``none``: tool calls are not parsed).
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    max_new_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    tool_choice: str = "auto"
    model: str = "policy"
    temperature: float | None = None
    top_p: float | None = None
    chars: int = 0
    """Characters of the call's text (contents, tool calls, tools), at most MAX_CALL_CHARS."""


def _text(content: Any, where: str) -> str:
    """Message content as text: a string, None, or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatRequestError(
                    f"{where}.content[{i}]", f"only text parts are supported, got {shown(kind)}"
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise ChatRequestError(f"{where}.content", "must be a string or a list of text parts")


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise ChatRequestError(f"{where}.tool_calls", "must be a list")
    calls = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatRequestError(f"{where}.tool_calls[{i}]", "needs function.name")
        arguments = fn.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(
            {
                "id": str(call.get("id", "")),
                "type": "function",
                "function": {"name": fn["name"], "arguments": arguments},
            }
        )
    return calls


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise ChatRequestError(where, f"must be an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise ChatRequestError(
            f"{where}.role", f"must be one of {', '.join(ROLES)}, got {shown(role)}"
        )
    message: dict[str, Any] = {"role": role, "content": _text(raw.get("content"), where)}
    if role == "assistant" and raw.get("tool_calls"):
        message["tool_calls"] = _tool_calls(raw["tool_calls"], where)
    if role == "tool":
        if not isinstance(raw.get("tool_call_id", ""), str):
            raise ChatRequestError(f"{where}.tool_call_id", "must be a string")
        message["tool_call_id"] = raw.get("tool_call_id", "")
    if isinstance(raw.get("name"), str):
        message["name"] = raw["name"]
    return message


def normalise_assistant(message: dict[str, Any]) -> tuple[str, tuple[tuple[str, str, str], ...]]:
    """What identifies an assistant message: its text and its tool calls (id, name, arguments)."""
    calls = tuple(
        (c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or ()
    )
    return message.get("content") or "", calls


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ChatRequestError(key, f"must be a number in [{low}, {high}], got {shown(value)}")
    return float(value)


def _max_tokens(body: dict[str, Any]) -> int | None:
    values = {
        k: body.get(k) for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None
    }
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ChatRequestError(key, f"must be an integer >= 1, got {shown(value)}")
    if len(set(values.values())) > 1:
        raise ChatRequestError("max_tokens", "differs from max_completion_tokens; send one")
    return next(iter(values.values()), None)


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS:
        raise ChatRequestError(
            "stop",
            f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS} stop strings",
        )
    if not all(isinstance(s, str) and s for s in stops):
        raise ChatRequestError("stop", "must be a non-empty string or a list of them")
    for i, stop in enumerate(stops):
        if len(stop) > MAX_STOP_CHARS:
            raise ChatRequestError(
                f"stop[{i}]", f"{len(stop)} characters; at most {MAX_STOP_CHARS} in a stop string"
            )
    return tuple(stops)


def _check_flags(body: dict[str, Any]) -> None:
    unknown = [k for k in body if k not in ACCEPTED_FIELDS]
    for key in unknown:
        why = (
            "is not supported by this endpoint" if key in REFUSED_FIELDS else "is not a known field"
        )
        raise ChatRequestError(key, why)
    if body.get("stream"):
        raise ChatRequestError("stream", "streaming is not supported; send stream=false")
    if body.get("n", 1) != 1:
        raise ChatRequestError(
            "n", f"only n=1 is supported (send one request per sample), got {shown(body['n'])}"
        )
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise ChatRequestError(
                key, "only 0 is supported (a penalty changes the sampled distribution)"
            )
    if body.get("top_logprobs") not in (None, 0):
        raise ChatRequestError(
            "top_logprobs", "only 0 is supported (the sampled token's log-prob is returned)"
        )
    if not isinstance(body.get("logprobs", False), (bool, type(None))):
        raise ChatRequestError("logprobs", "must be true or false")
    for key in ("model", "user"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise ChatRequestError(key, "must be a string")


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list)
        and all(isinstance(t, dict) and t.get("type") == "function" for t in tools)
    ):
        raise ChatRequestError("tools", 'must be a list of {"type": "function", "function": {...}}')
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ChatRequestError("tool_choice", "only 'auto' and 'none' are supported")
    if body.get("parallel_tool_calls") not in (None, True, False):
        raise ChatRequestError("parallel_tool_calls", "must be true or false")
    return tools or None, choice or "auto"


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a chat-completions body (see the module doc and docs/agents.md for the fields).

    Raises:
        ChatRequestError: naming the field that is missing, malformed or unsupported.
    """
    if not isinstance(body, dict):
        raise ChatRequestError(
            None, f"the request body must be a JSON object, got {type(body).__name__}"
        )
    bad = check_unicode(body, "body")
    if bad is not None:
        raise ChatRequestError(bad.removeprefix("body."), "not valid Unicode (a lone surrogate)")
    _check_flags(body)
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ChatRequestError("messages", "must be a non-empty list of messages")
    if len(raw_messages) > MAX_MESSAGES:
        raise ChatRequestError(
            "messages", f"{len(raw_messages)} messages; at most {MAX_MESSAGES} in one call"
        )
    messages = [_message(m, i) for i, m in enumerate(raw_messages)]
    tools, tool_choice = _tools(body)
    chars = _chars(messages, tools)
    if chars > MAX_CALL_CHARS:
        raise ChatRequestError(
            "messages", f"{chars} characters of text; at most {MAX_CALL_CHARS} in one call"
        )
    return ChatRequest(
        chars=chars,
        messages=messages,
        tools=tools,
        max_new_tokens=_max_tokens(body),
        stop=_stop(body.get("stop")),
        logprobs=bool(body.get("logprobs")),
        tool_choice=tool_choice,
        model=body.get("model") or "policy",
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
    )


def _chars(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> int:
    """Characters of text in normalised ``messages`` and ``tools``."""
    total = 0
    for m in messages:
        total += len(m["content"])
        for call in m.get("tool_calls") or ():
            total += len(call["function"]["name"]) + len(call["function"]["arguments"])
    if tools:
        total += len(json.dumps(tools))  # bounded by the body limit; depth by the parser's
    return total
