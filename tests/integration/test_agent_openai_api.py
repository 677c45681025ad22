"""The agent endpoint's newer API surface through the real ``openai`` client: streaming chat
completions and responses, ``n > 1``, ``/v1/responses`` with function tools, call outputs and
``previous_response_id``, named tool-call and reasoning parsers; every call still recorded
token-in/token-out (prompt ids, completion ids, behaviour log-probs, versions)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
import openai
import pytest
from agentic_helpers import VersionedTinyEngine, tiny_model_and_tokenizer
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.rollout.openai.endpoint import AgentProxy

TEMPERATURE = 0.9
CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "37*45"}}</tool_call>'
RESPONSE_TOOL = {
    "type": "function",
    "name": "calc",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}
CHAT_TOOL = {
    "type": "function",
    "function": {k: v for k, v in RESPONSE_TOOL.items() if k != "type"},
}


class Scripted(ScriptOnlyEngine):
    """Answers each call with the next scripted text (ending with EOS), log-prob -0.01*(i+1)."""

    version = 3

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.requests = tokenizer, list(texts), []

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        ids = self.tokenizer(self.texts.pop(0) + "<|im_end|>", add_special_tokens=False)[
            "input_ids"
        ][: request.sampling.max_new_tokens]
        lp = [-0.01 * (i + 1) for i in range(len(ids))]
        finish = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return ModelResponse(list(request.input_ids), ids, lp, [self.version] * len(ids), finish)


def _serve(tokenizer: Any, engine: Any, test: Any, max_new: int = 200, **proxy_kwargs: Any):
    """Run ``await test(client, session)`` against a fresh endpoint session."""
    proxy = AgentProxy(tokenizer, [tokenizer.eos_token_id], **proxy_kwargs)
    sampling = SamplingParams(max_new_tokens=max_new, temperature=TEMPERATURE)

    async def run() -> Any:
        session = proxy.open_session(engine, sampling, max_new, TEMPERATURE, 1.0)
        client = openai.AsyncOpenAI(
            base_url=session.base_url, api_key=session.api_key, max_retries=0
        )
        return await test(client, session)

    try:
        return asyncio.run(run())
    finally:
        proxy.close()


def test_chat_stream_matches_the_recorded_call_and_n_choices_are_each_recorded() -> None:
    model, tokenizer = tiny_model_and_tokenizer()
    engine = VersionedTinyEngine(model, tokenizer)

    async def test(client: openai.AsyncOpenAI, session: Any) -> None:
        messages = [{"role": "user", "content": "hello"}]
        stream = await client.chat.completions.create(
            model="p", messages=messages, stream=True, stream_options={"include_usage": True}
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        call = session.calls[0]
        eos = tokenizer.eos_token_id
        assert text == tokenizer.decode([t for t in call.completion_ids if t != eos])
        assert chunks[-1].usage.completion_tokens == len(call.completion_ids)
        assert chunks[-2].choices[0].finish_reason in ("stop", "length")
        many = await client.chat.completions.create(model="p", messages=messages, n=3)
        assert [c.index for c in many.choices] == [0, 1, 2]
        # the choices are generated at once, so their records are kept in the order they end
        assert len(session.calls) == 4 and sorted(session.interactions[many.id]) == [1, 2, 3]
        assert many.usage.completion_tokens == sum(
            len(session.calls[i].completion_ids) for i in (1, 2, 3)
        )
        texts = {
            i: tokenizer.decode([t for t in session.calls[i].completion_ids if t != eos])
            for i in (1, 2, 3)
        }
        # each choice: its own exact record
        assert sorted(c.message.content for c in many.choices) == sorted(texts.values())
        # continuing choice 1 merges onto exactly that call's tokens
        follow = [*messages, many.choices[1].message, {"role": "user", "content": "more"}]
        await client.chat.completions.create(model="p", messages=follow)
        parent = session.calls[-1].parent
        assert parent in texts and texts[parent] == many.choices[1].message.content
        chained = session.calls[parent]
        assert session.calls[-1].prompt_ids[
            : len(chained.prompt_ids) + len(chained.completion_ids)
        ] == (chained.prompt_ids + chained.completion_ids)

    _serve(tokenizer, engine, test, max_new=6)


def test_responses_with_tools_call_outputs_and_previous_response_id() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = Scripted(tokenizer, ["Let me. " + CALL, "It is 1665.", "Done."])

    async def test(client: openai.AsyncOpenAI, session: Any) -> None:
        first = await client.responses.create(
            model="p", input="What is 37*45?", instructions="Be brief.", tools=[RESPONSE_TOOL]
        )
        kinds = [item.type for item in first.output]
        assert kinds == ["message", "function_call"] and first.output_text == "Let me."
        call = first.output[1]
        assert call.name == "calc" and json.loads(call.arguments) == {"expression": "37*45"}
        assert call.call_id == session.calls[0].reply["tool_calls"][0]["id"]
        # the full conversation sent back (as the Agents SDK does): merged on call 0's tokens
        items: list[Any] = [{"role": "user", "content": "What is 37*45?"}]
        items += [item.model_dump(exclude_none=True) for item in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "1665"})
        second = await client.responses.create(
            model="p", input=items, instructions="Be brief.", tools=[RESPONSE_TOOL]
        )
        assert second.output_text == "It is 1665." and session.calls[1].parent == 0
        text = tokenizer.decode(session.calls[1].prompt_ids)
        assert text.startswith("<|im_start|>system\nBe brief.")
        assert "<|im_start|>tool\n1665<|im_end|>" in text
        # previous_response_id: only the new input, the same tokens underneath
        third = await client.responses.create(
            model="p",
            previous_response_id=second.id,
            instructions="Be brief.",
            input=[{"role": "user", "content": "Thanks"}],
            tools=[RESPONSE_TOOL],
        )
        assert third.output_text == "Done." and session.calls[2].parent == 1
        assert session.interactions == {first.id: [0], second.id: [1], third.id: [2]}
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await client.responses.create(model="p", input="x", previous_response_id="resp_0")
        with pytest.raises(openai.BadRequestError, match=r"tools\[0\].type"):
            await client.responses.create(
                model="p", input="x", tools=[{"type": "web_search_preview"}]
            )
        with pytest.raises(openai.BadRequestError, match=r"input\[0\].type"):
            await client.responses.create(model="p", input=[{"type": "item_reference", "id": "x"}])

    _serve(tokenizer, engine, test)
    assert engine.texts == []  # the three good calls, nothing else reached the engine


def test_previous_response_id_of_another_session_is_refused() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = Scripted(tokenizer, ["one", "two"])
    proxy = AgentProxy(tokenizer, [tokenizer.eos_token_id])
    sampling = SamplingParams(max_new_tokens=64, temperature=TEMPERATURE)

    async def run() -> None:
        a = proxy.open_session(engine, sampling, 64, TEMPERATURE, 1.0)
        b = proxy.open_session(engine, sampling, 64, TEMPERATURE, 1.0)
        client_a = openai.AsyncOpenAI(base_url=a.base_url, api_key=a.api_key, max_retries=0)
        client_b = openai.AsyncOpenAI(base_url=b.base_url, api_key=b.api_key, max_retries=0)
        first = await client_a.responses.create(model="p", input="hi")
        with pytest.raises(openai.BadRequestError) as caught:
            await client_b.responses.create(model="p", input="x", previous_response_id=first.id)
        assert caught.value.body["param"] == "previous_response_id"
        assert b.calls == [] and len(a.calls) == 1
        assert (await client_b.responses.create(model="p", input="again")).output_text == "two"

    try:
        asyncio.run(run())
    finally:
        proxy.close()


def test_streamed_response_events_and_reasoning_items() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = Scripted(tokenizer, ["<think>37*45 is big</think>" + CALL, "<think>ok</think>1665"])

    async def test(client: openai.AsyncOpenAI, session: Any) -> None:
        stream = await client.responses.create(
            model="p", input="37*45?", tools=[RESPONSE_TOOL], stream=True
        )
        events = [e async for e in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        final = events[-1].response
        assert [i.type for i in final.output] == ["reasoning", "function_call"]
        assert final.output[0].content[0].text == "37*45 is big"
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert json.loads(done[0].arguments) == {"expression": "37*45"}
        chat = await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "q"}], tools=[CHAT_TOOL]
        )
        message = chat.choices[0].message
        assert message.content == "1665" and message.reasoning_content == "ok"
        # the tokens are the generated ones, reasoning included (nothing re-tokenised)
        assert (
            tokenizer.decode(session.calls[1].completion_ids) == "<think>ok</think>1665<|im_end|>"
        )

    _serve(tokenizer, engine, test, reasoning="qwen3")


def test_a_stream_the_client_drops_is_contained(caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = Scripted(tokenizer, ["word " * 30, "after"])

    async def test(client: openai.AsyncOpenAI, session: Any) -> None:
        body = {"model": "p", "input": "hi", "stream": True}
        headers = {"Authorization": f"Bearer {session.api_key}"}
        async with (
            httpx.AsyncClient() as http,
            http.stream("POST", f"{session.base_url}/responses", json=body, headers=headers) as raw,
        ):
            async for _ in raw.aiter_bytes(16):
                break  # drop the connection after the first bytes
        await asyncio.sleep(0.2)
        assert len(session.calls) == 1  # recorded whole, before the first byte
        assert (await client.responses.create(model="p", input="again")).output_text == "after"

    with caplog.at_level(logging.WARNING, logger="areal_m2po.agent_proxy"):
        _serve(tokenizer, engine, test, max_new=200)


def test_a_response_cut_at_its_token_limit_says_so_and_stays_completed() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = Scripted(tokenizer, ["a long answer", "another long answer"])

    async def test(client: openai.AsyncOpenAI, session: Any) -> None:
        cut = await client.responses.create(model="p", input="hi", max_output_tokens=3)
        assert cut.output_text == "a l" and cut.incomplete_details.reason == "max_output_tokens"
        assert cut.status == "completed"  # the Agents SDK raises on "incomplete"
        assert session.calls[0].finish_reason == "length"  # trained as cut (no EOS)
        stream = await client.responses.create(
            model="p", input="hi", max_output_tokens=3, stream=True
        )
        events = [e async for e in stream]
        assert events[-1].type == "response.completed"
        assert events[-1].response.incomplete_details.reason == "max_output_tokens"

    _serve(tokenizer, engine, test)
