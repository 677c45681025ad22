"""Tool calls and reasoning read from a completion's text, by the parser a config names.

``rollout.agent.tool_call_parser`` (AReaL's key) names the tool-call format. Every name it
accepts reads the Hermes / Qwen 2.5 / Qwen 3 format, ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>``; ``none`` reads none. ``rollout.agent.reasoning_parser`` names how reasoning
is marked: ``qwen3`` and ``deepseek-r1`` read ``<think>...</think>`` (``deepseek-r1`` also
takes the text before a lone ``</think>``, its template opening the tag in the prompt).

Both parsers are total: any text returns a result, never an exception (a body nested too
deep for ``json``, a tag never closed, non-JSON); a tool call that does not parse stays in the
text, so the agent sees what the model wrote and no call is made.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

__all__ = ["ReasoningParser", "ToolCallParser", "reasoning_parser", "tool_call_parser"]

ToolCallParser = Callable[[str], tuple[str, list[dict[str, Any]]]]
"""``text -> (text outside the parsed calls, OpenAI tool_calls)``."""
ReasoningParser = Callable[[str], tuple[str | None, str]]
"""``text -> (reasoning or None, the rest of the text)``."""

_HERMES_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_NAMES = ("qwen", "qwen25", "qwen3", "hermes")


def _load_call(body: str) -> dict[str, Any] | None:
    """An OpenAI tool call from a JSON body ``{"name": str, "arguments": object|str}``, or
    None when the body is not that (never raises)."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    if not (isinstance(payload, dict) and isinstance(payload.get("name"), str)):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if not isinstance(arguments, str):
        try:
            arguments = json.dumps(arguments)
        except (ValueError, RecursionError, TypeError):
            return None
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": payload["name"], "arguments": arguments},
    }
    try:  # a lone surrogate (an escape in the JSON) cannot go into the UTF-8 answer
        json.dumps(call, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None
    return call


def parse_hermes(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``<tool_call>{json}</tool_call>`` blocks of ``text`` (see the module doc). The content
    is the text around the well-formed calls, stripped; ``text`` unchanged when there is
    none."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _HERMES_RE.finditer(text):
        call = _load_call(match.group(1).strip())
        if call is None:
            continue
        calls.append(call)
        kept.append(text[position : match.start()])
        position = match.end()
    if not calls:
        return text, []
    kept.append(text[position:])
    return "".join(kept).strip(), calls


def _no_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    return text, []


def tool_call_parser(name: str) -> ToolCallParser:
    """The parser ``rollout.agent.tool_call_parser`` names (ValueError naming the key for an
    unknown one)."""
    if name in _HERMES_NAMES:
        return parse_hermes
    if name == "none":
        return _no_tool_calls
    raise ValueError(f"rollout.agent.tool_call_parser: unknown parser {name!r}")


def split_think(text: str, open_may_be_in_prompt: bool = False) -> tuple[str | None, str]:
    """(reasoning, rest) of ``text`` with ``<think>reasoning</think>rest``; with
    ``open_may_be_in_prompt``, ``reasoning</think>rest`` too. A ``<think>`` never closed is all
    reasoning (the model ran out of tokens while thinking). No tag: (None, text)."""
    start = text.find("<think>")
    end = text.find("</think>", start + 7 if start >= 0 else 0)
    if start >= 0 and (end < 0 or start < end):
        body_end = end if end >= 0 else len(text)
        reasoning = text[start + 7 : body_end]
        rest = text[:start] + (text[end + 8 :] if end >= 0 else "")
        return reasoning.strip(), rest.strip()
    if open_may_be_in_prompt and end >= 0:
        return text[:end].strip(), text[end + 8 :].strip()
    return None, text


def _no_reasoning(text: str) -> tuple[str | None, str]:
    return None, text


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser ``rollout.agent.reasoning_parser`` names (ValueError naming the key for an
    unknown one)."""
    if name == "qwen3":
        return split_think
    if name in ("deepseek-r1", "deepseek_r1"):
        return lambda text: split_think(text, open_may_be_in_prompt=True)
    if name == "none":
        return _no_reasoning
    raise ValueError(f"rollout.agent.reasoning_parser: unknown parser {name!r}")
