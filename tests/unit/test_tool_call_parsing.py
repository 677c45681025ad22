"""Tool-call parsing of a completion never raises, whatever the model wrote (issue 46): the
text outside the calls and the calls it returns can always be sent back as JSON, and text
that holds no well-formed call comes back unchanged."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from areal_m2po.rollout.openai.chat_request import parse_tool_calls

PIECES = st.sampled_from(
    ["<tool_call>", "</tool_call>", "{", "}", "[", "]", '"name"', '"arguments"', ":", ",",
     '"calc"', "\\ud800", '"', "1e400", "9" * 5000, " ", "\n"]
)  # fmt: skip
TEXTS = st.one_of(
    st.text(max_size=300),
    st.lists(st.one_of(PIECES, st.text(max_size=5)), max_size=80).map("".join),
)


def _sendable(content: str, calls: list) -> None:
    json.dumps({"content": content, "tool_calls": calls}, ensure_ascii=False).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_parsing_never_raises_and_its_output_is_sendable(text):
    content, calls = parse_tool_calls(text)
    _sendable(content, calls)
    if not calls:
        assert content == text
    for call in calls:
        assert isinstance(call["function"]["name"], str)
        assert isinstance(call["function"]["arguments"], str)


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=900, max_value=5000), st.sampled_from(["[", '{"a":', '[{"b":']))
def test_deeply_nested_calls_stay_in_the_text(depth, opener):
    text = "<tool_call>" + opener * depth + "</tool_call>"
    assert parse_tool_calls(text) == (text, [])
    wrapped = (
        '<tool_call>{"name": "calc", "arguments": ' + "[" * depth + "]" * depth + "}</tool_call>"
    )
    content, calls = parse_tool_calls(wrapped)
    _sendable(content, calls)


def test_a_well_formed_call_is_still_parsed():
    content, calls = parse_tool_calls(
        'ok <tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'
    )
    assert content == "ok" and calls[0]["function"] == {"name": "calc", "arguments": '{"x": 1}'}


def test_a_call_whose_name_is_a_lone_surrogate_stays_in_the_text():
    text = '<tool_call>{"name": "\\ud800", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text) == (text, [])
