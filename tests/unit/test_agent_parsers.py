"""Named tool-call and reasoning parsers: exact splits, malformed calls kept in the text, and
no input that makes them raise."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_m2po.rollout.openai.tool_parsers import (
    parse_hermes,
    reasoning_parser,
    split_think,
    tool_call_parser,
)

CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'


def test_hermes_calls_are_split_from_the_text() -> None:
    content, calls = parse_hermes(f"Sure. {CALL} and {CALL.replace('2+3', '4*5')} done")
    assert content == "Sure.  and  done"
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"expression": "2+3"},
        {"expression": "4*5"},
    ]
    assert all(c["function"]["name"] == "calc" and c["id"].startswith("call_") for c in calls)
    assert len({c["id"] for c in calls}) == 2
    # string arguments are kept as given; "parameters" is read as Hermes writes it
    one = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')[1]
    assert one[0]["function"]["arguments"] == '{"a": 1}'
    two = parse_hermes('<tool_call>{"name": "f", "parameters": {"a": 1}}</tool_call>')[1]
    assert json.loads(two[0]["function"]["arguments"]) == {"a": 1}


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": 3}</tool_call>',
        '<tool_call>{"name": "f"',
        "<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": ' + "[" * 1000 + "]" * 1000 + "}</tool_call>",
    ],
)
def test_a_malformed_call_stays_in_the_text(text: str) -> None:
    assert parse_hermes(text) == (text, [])


def test_parsers_by_name() -> None:
    for name in ("qwen", "qwen25", "qwen3", "hermes"):
        assert tool_call_parser(name)(CALL)[1][0]["function"]["name"] == "calc"
    assert tool_call_parser("none")(CALL) == (CALL, [])
    assert reasoning_parser("qwen3")("<think>a</think>b") == ("a", "b")
    assert reasoning_parser("deepseek-r1")("a</think>b") == ("a", "b")
    assert reasoning_parser("qwen3")("a</think>b") == (None, "a</think>b")
    assert reasoning_parser("none")("<think>a</think>b") == (None, "<think>a</think>b")
    with pytest.raises(ValueError, match="rollout.agent.tool_call_parser: unknown parser 'x'"):
        tool_call_parser("x")
    with pytest.raises(ValueError, match="rollout.agent.reasoning_parser"):
        reasoning_parser("x")


def test_think_split() -> None:
    assert split_think("<think> plan </think>\n\nanswer") == ("plan", "answer")
    assert split_think("<think>cut off") == ("cut off", "")  # ran out of tokens thinking
    assert split_think("no tags") == (None, "no tags")
    assert split_think("x</think>y<think>z</think>") == ("z", "x</think>y")


_PIECES = [*'<>/{}[]":, ntoolcalhikme_', "<tool_call>", "</tool_call>", "<think>", "</think>"]
_TAGGY = st.lists(st.sampled_from(_PIECES), max_size=80).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), _TAGGY))
def test_parsers_never_raise(text: str) -> None:
    for name in ("qwen", "none"):
        content, calls = tool_call_parser(name)(text)
        assert isinstance(content, str) and isinstance(calls, list)
        if not calls:
            assert content == text  # nothing parsed: the text as the model wrote it
    for name in ("qwen3", "deepseek-r1", "none"):
        reasoning, rest = reasoning_parser(name)(text)
        assert reasoning is None or isinstance(reasoning, str)
        assert isinstance(rest, str)


def test_a_dropped_stream_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from areal_m2po.rollout.openai.streaming import sse_body

    async def drop_after_one() -> None:
        body = sse_body(["data: 1\n\n", "data: 2\n\n", "data: [DONE]\n\n"], "chat completion")
        assert await body.__anext__() == b"data: 1\n\n"
        await body.aclose()  # what the server does when the client disconnects

    with caplog.at_level("WARNING", logger="areal_m2po.agent_proxy"):
        asyncio.run(drop_after_one())
    assert [r.getMessage() for r in caplog.records] == [
        "agent endpoint: the client dropped the chat completion stream after 1 of 3 events; "
        "the call stays recorded"
    ]
