"""What the endpoint's chat-completions and responses routes do with a session's request.

:func:`serve_chat` answers ``POST /v1/chat/completions`` (``n`` choices, each one engine call
recorded in the session; ``stream`` as server-sent events); :func:`serve_responses` answers
``POST /v1/responses`` through the same calls (:mod:`areal_m2po.rollout.openai.responses`).
Both raise :class:`~areal_m2po.rollout.openai.chat_request.ChatRequestError` for a field they
refuse; the endpoint turns the exceptions into HTTP answers.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi.responses import StreamingResponse

from areal_m2po.rollout.openai.chat_request import ChatRequestError, parse_chat_request
from areal_m2po.rollout.openai.limits import shown
from areal_m2po.rollout.openai.responses import to_chat_body, to_response
from areal_m2po.rollout.openai.streaming import (
    chat_events,
    response_events,
    sse_body,
    stream_fields,
)

__all__ = ["serve_chat", "serve_responses"]


def _merge_choices(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One completion of ``n`` single-choice completions of the same request: choices
    renumbered, the prompt counted once, the completion tokens summed."""
    merged = dict(results[0])
    merged["choices"] = [{**r["choices"][0], "index": i} for i, r in enumerate(results)]
    prompt = results[0]["usage"]["prompt_tokens"]
    completion = sum(r["usage"]["completion_tokens"] for r in results)
    merged["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    return merged


async def serve_chat(proxy: Any, session: Any, body: Any) -> Any:
    """A chat completion of ``session`` (``proxy``: the endpoint's
    :class:`~areal_m2po.rollout.openai.endpoint.AgentProxy`); each of the ``n`` choices is its
    own engine call and record, under the completion's id, all
    from one prompt rendered and tokenised once."""
    body, fields = await proxy.off_loop(stream_fields, body)
    request = await proxy.off_loop(parse_chat_request, body)
    completion_id = f"chatcmpl-{secrets.token_hex(12)}"
    results = await proxy._complete_n(session, request, fields.n, completion_id)
    completion = _merge_choices(results)
    if fields.stream:
        events = chat_events(completion, fields.include_usage)
        return StreamingResponse(
            sse_body(events, "chat completion"), media_type="text/event-stream"
        )
    return completion


def _history(session: Any, body: dict[str, Any]) -> list[dict[str, Any]] | None:
    previous = body.get("previous_response_id")
    if previous is None:
        return None
    history = session.responses.get(previous) if isinstance(previous, str) else None
    if history is None:
        raise ChatRequestError(
            "previous_response_id", f"no response {shown(previous)} in this session"
        )
    return list(history)


async def serve_responses(proxy: Any, session: Any, body: Any) -> Any:
    """A response of ``session``: one engine call and record, under the response's id, kept
    for a later ``previous_response_id`` of the same session."""
    if not isinstance(body, dict):
        raise ChatRequestError(None, "the request body must be a JSON object")
    if body.get("stream") not in (None, True, False):
        raise ChatRequestError("stream", "must be true or false")
    chat_body, conversation = await proxy.off_loop(to_chat_body, body, _history(session, body))
    request = await proxy.off_loop(parse_chat_request, chat_body)
    response_id = f"resp_{secrets.token_hex(12)}"
    completion = await proxy._complete(session, request, response_id)
    message = completion["choices"][0]["message"]
    reply = {k: message[k] for k in ("role", "content", "tool_calls") if k in message}
    session.responses[response_id] = [*conversation, reply]
    response = to_response(completion, body, response_id)
    if body.get("stream"):
        events = response_events(response)
        return StreamingResponse(sse_body(events, "response"), media_type="text/event-stream")
    return response
