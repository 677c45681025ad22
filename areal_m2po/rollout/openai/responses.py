"""The Responses API (``POST /v1/responses``) as chat completions of the same session.

:func:`to_chat_body` turns a Responses body into a chat-completions body, which
:func:`~areal_m2po.rollout.openai.chat_request.parse_chat_request` then checks like any other
(so every field is used, checked or refused the same way, and the call is generated, merged
and recorded token-in/token-out like a chat completion); :func:`to_response` turns the chat
completion back into a ``response`` object.

Input items: ``message`` (roles ``user``, ``system``, ``developer``, ``assistant``; text or
``input_text`` / ``output_text`` parts), ``function_call`` (joined to the assistant message
before it) and ``function_call_output`` (a ``tool`` message); ``reasoning`` items are skipped
(a merged call keeps the tokens the model generated, its reasoning included). ``instructions``
is a leading system message, not carried over by ``previous_response_id``, which continues a
response of the same session: its conversation, then its output, then the new input.
Output items: ``reasoning`` (when a reasoning parser is set and the model reasoned),
``message`` and ``function_call`` (``call_id`` the tool call's id).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from areal_m2po.rollout.openai.chat_request import ChatRequestError
from areal_m2po.rollout.openai.limits import check_unicode, shown

__all__ = ["RESPONSE_FIELDS", "to_chat_body", "to_response"]

RESPONSE_FIELDS = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "previous_response_id",
    "stream",
    "store",
    "include",
    "truncation",
    "text",
    "reasoning",
    "user",
    "top_logprobs",
)
"""Fields read; ``store`` and ``user`` are informational, ``include``, ``truncation`` and
``top_logprobs`` accepted at their neutral values only, ``text`` with the text format only;
``reasoning`` (``effort``, ``summary``) and ``text.verbosity`` are OpenAI models' knobs the
Agents SDK sends by default: informational (the policy samples as the trainer says, and the
reasoning parser decides what is reasoning). Any other field is refused with HTTP 400."""
_PASSED = ("model", "tool_choice", "parallel_tool_calls", "temperature", "top_p", "user")
_TEXT_PARTS = ("input_text", "output_text", "text")


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise ChatRequestError(f"{where}.content", "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ChatRequestError(f"{where}.content[{j}]", f"only text parts, got {shown(kind)}")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "")
    if not (isinstance(name, str) and isinstance(call_id, str) and isinstance(arguments, str)):
        raise ChatRequestError(where, "a function_call needs string call_id, name, arguments")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def input_messages(raw: Any) -> list[dict[str, Any]]:
    """Chat messages of a Responses ``input`` (a string or a list of items).

    Raises:
        ChatRequestError: naming the item (``input[i]``) that is malformed or unsupported.
    """
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ChatRequestError("input", "must be a string or a list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ChatRequestError(where, f"must be an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ChatRequestError(f"{where}.role", f"unsupported role {shown(role)}")
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise ChatRequestError(f"{where}.call_id", "must be a string")
            output = _text(item.get("output"), where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        elif kind != "reasoning":
            raise ChatRequestError(f"{where}.type", f"unsupported input item type {shown(kind)}")
    return messages


def _tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ChatRequestError("tools", "must be a list of function tools")
    tools = []
    for i, tool in enumerate(raw):
        if not (isinstance(tool, dict) and tool.get("type") == "function"):
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise ChatRequestError(f"tools[{i}].type", f"only function tools, got {shown(kind)}")
        if not isinstance(tool.get("name"), str):
            raise ChatRequestError(f"tools[{i}].name", "must be a string")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools or None


def _check_neutral(body: dict[str, Any]) -> None:
    for key in body:
        if key not in RESPONSE_FIELDS:
            raise ChatRequestError(key, "is not supported by this endpoint's /v1/responses")
    neutral = {
        "include": (None, []),
        "truncation": (None, "disabled"),
        "top_logprobs": (None, 0),
        "store": (None, True, False),
    }
    for key, allowed in neutral.items():
        if key in body and body[key] not in allowed:
            raise ChatRequestError(key, f"only {[a for a in allowed if a is not None]} accepted")
    text = body.get("text")
    if text is not None and not (
        isinstance(text, dict)
        and set(text) <= {"format", "verbosity"}
        and text.get("format", {"type": "text"}) == {"type": "text"}
    ):
        raise ChatRequestError("text", 'only {"format": {"type": "text"}} is supported')
    reasoning = body.get("reasoning")
    if reasoning is not None and not (
        isinstance(reasoning, dict) and set(reasoning) <= {"effort", "summary", "generate_summary"}
    ):
        raise ChatRequestError("reasoning", "only effort and summary (informational)")


def to_chat_body(
    body: Any, history: list[dict[str, Any]] | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the chat-completions body of a Responses body, ``stream`` left out; the conversation
    a later ``previous_response_id`` continues, before the reply: ``history`` then the new
    input, without ``instructions``). ``history``: the conversation of the response that
    ``previous_response_id`` names, its output included.

    Raises:
        ChatRequestError: naming the field that is malformed or unsupported.
    """
    if not isinstance(body, dict):
        raise ChatRequestError(None, "the request body must be a JSON object")
    bad = check_unicode(body, "body")  # before any field name is echoed
    if bad is not None:
        raise ChatRequestError(bad.removeprefix("body."), "not valid Unicode (a lone surrogate)")
    _check_neutral(body)
    conversation = list(history or []) + input_messages(body.get("input"))
    messages = list(conversation)
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ChatRequestError("instructions", "must be a string")
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict[str, Any] = {k: body[k] for k in _PASSED if body.get(k) is not None}
    chat["messages"] = messages
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat, conversation


def _output(message: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        text = message["reasoning_content"]
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{secrets.token_hex(12)}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
                "status": "completed",
            }
        )
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        part: dict[str, Any] = {
            "type": "output_text",
            "text": message.get("content") or "",
            "annotations": [],
        }
        items.append(
            {
                "type": "message",
                "id": f"msg_{secrets.token_hex(12)}",
                "role": "assistant",
                "status": "completed",
                "content": [part],
            }
        )
    for call in calls:
        fn = call["function"]
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{secrets.token_hex(12)}",
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
                "status": "completed",
            }
        )
    return items


def to_response(completion: dict[str, Any], body: dict[str, Any], response_id: str) -> dict:
    """The ``response`` object of a chat ``completion`` (its first choice) for ``body``."""
    choice = completion["choices"][0]
    usage = completion["usage"]
    cut = choice["finish_reason"] == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": float(completion.get("created", time.time())),
        # cut at its token limit: still "completed" (the Agents SDK raises on "incomplete",
        # which would end the episode); incomplete_details says it was cut
        "status": "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": completion["model"],
        "instructions": body.get("instructions"),
        "output": _output(choice["message"]),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
    }
