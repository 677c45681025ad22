"""Server-sent events for the agent endpoint: the event formats the ``openai`` client parses.

The engine generates a completion whole, so a stream is the finished call replayed as events:
``chat.completion.chunk`` objects then ``data: [DONE]`` for chat completions, and the
``response.*`` events (``response.created`` ... ``response.completed``) for responses. The call
is recorded in its session before the first byte is sent, so a client that drops the stream
halfway leaves a consistent session (the call recorded whole, off the trajectory's chain
unless the agent sends it back); :func:`sse_body` logs the drop in one line and the session
goes on.

:func:`stream_fields` takes the streaming fields (``stream``, ``stream_options``, ``n``) out of a
chat-completions body before :func:`~areal_m2po.rollout.openai.chat_request.parse_chat_request`
checks the rest.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from areal_m2po.rollout.openai.chat_request import ChatRequestError
from areal_m2po.rollout.openai.limits import shown

__all__ = ["MAX_CHOICES", "StreamFields", "chat_events", "response_events", "sse_body"]

logger = logging.getLogger("areal_m2po.agent_proxy")
MAX_CHOICES = 16
"""The most choices (``n``) one chat-completions request may ask for."""


@dataclass(frozen=True)
class StreamFields:
    """``stream``, ``stream_options.include_usage`` and ``n`` of a request."""

    stream: bool = False
    include_usage: bool = False
    n: int = 1


def stream_fields(body: Any, allow_n: bool = True) -> tuple[Any, StreamFields]:
    """(``body`` without ``stream``/``stream_options``/``n``, their checked values).

    Raises:
        ChatRequestError: naming the malformed field.
    """
    if not isinstance(body, dict):
        return body, StreamFields()
    rest = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "n")}
    stream = body.get("stream")
    if stream not in (None, True, False):
        raise ChatRequestError("stream", "must be true or false")
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise ChatRequestError("stream_options", "only with stream=true")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise ChatRequestError("stream_options", 'only {"include_usage": bool} is supported')
    n = body.get("n", 1) if allow_n else 1
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise ChatRequestError("n", f"must be an integer in [1, {MAX_CHOICES}], got {shown(n)}")
    include = bool((options or {}).get("include_usage"))
    return rest, StreamFields(bool(stream), include, n)


def _sse(payload: dict[str, Any], event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n"


def chat_events(completion: dict[str, Any], include_usage: bool) -> list[str]:
    """A finished ``chat.completion`` as ``chat.completion.chunk`` events and ``[DONE]``."""
    base = {k: completion[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    events = []

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> None:
        choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
        events.append(_sse({**base, "choices": [choice]}))

    for choice in completion["choices"]:
        i, message = choice["index"], choice["message"]
        chunk(i, {"role": "assistant", "content": ""})
        if message.get("reasoning_content"):
            chunk(i, {"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            chunk(i, {"content": message["content"]})
        for k, call in enumerate(message.get("tool_calls") or ()):
            chunk(i, {"tool_calls": [{"index": k, **call}]})
        chunk(i, {}, choice["finish_reason"])
    if include_usage:
        events.append(_sse({**base, "choices": [], "usage": completion["usage"]}))
    events.append("data: [DONE]\n\n")
    return events


def _item_events(item: dict[str, Any], index: int) -> list[tuple[str, dict[str, Any]]]:
    """(type, payload) of one output item's events, from ``output_item.added`` to ``.done``."""
    out: list[tuple[str, dict[str, Any]]] = []
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "message":
        out.append(("response.output_item.added", {"item": {**item, "content": []}}))
        for k, part in enumerate(item["content"]):
            where = {**at, "content_index": k}
            empty = {**part, "text": ""}
            out.append(("response.content_part.added", {**where, "part": empty}))
            delta = {**where, "delta": part["text"], "logprobs": []}
            out.append(("response.output_text.delta", delta))
            done = {**where, "text": part["text"], "logprobs": []}
            out.append(("response.output_text.done", done))
            out.append(("response.content_part.done", {**where, "part": part}))
    elif item["type"] == "function_call":
        out.append(("response.output_item.added", {"item": {**item, "arguments": ""}}))
        out.append(("response.function_call_arguments.delta", {**at, "delta": item["arguments"]}))
        done = {**at, "arguments": item["arguments"], "name": item["name"]}
        out.append(("response.function_call_arguments.done", done))
    else:
        out.append(("response.output_item.added", {"item": item}))
    out.append(("response.output_item.done", {"item": item}))
    for _kind, payload in out:
        payload.setdefault("output_index", index)
    return out


def response_events(response: dict[str, Any]) -> list[str]:
    """A finished ``response`` object as the ``response.*`` events, from ``response.created``
    to ``response.completed``."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    typed: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
    ]
    for index, item in enumerate(response["output"]):
        typed.extend(_item_events(item, index))
    typed.append(("response.completed", {"response": response}))
    return [
        _sse({"type": kind, "sequence_number": seq, **payload}, kind)
        for seq, (kind, payload) in enumerate(typed)
    ]


async def sse_body(events: list[str], what: str) -> AsyncIterator[bytes]:
    """The events as a response body; a client that disconnects before the last one is
    logged in one line (``what`` names the call) and nothing else happens."""
    sent = 0
    try:
        for event in events:
            sent += 1  # handed to the server
            yield event.encode()
    except (asyncio.CancelledError, GeneratorExit):
        logger.warning(
            "agent endpoint: the client dropped the %s stream after %d of %d events; the call "
            "stays recorded",
            what,
            sent,
            len(events),
        )
        raise
