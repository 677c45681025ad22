"""The OpenAI-compatible agent endpoint, driven by the real ``openai`` client over loopback."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import openai
import pytest
import torch
from agentic_helpers import VersionedTinyEngine, forward_logprobs, tiny_model_and_tokenizer
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.async_executor import AsyncRolloutExecutor
from areal_m2po.rollout.executor import RolloutSetup, arun_group
from areal_m2po.rollout.openai.chat_request import parse_tool_calls
from areal_m2po.rollout.openai.endpoint import AgentProxy
from areal_m2po.rollout.staleness import StalenessBudget
from areal_m2po.rollout.sync_executor import SyncRolloutExecutor
from areal_m2po.rollout.workflows.agent.workflow import AgentWorkflow
from areal_m2po.rollout.workflows.multi_turn.calculator import calculate

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
TEMPERATURE = 0.9


def _run_group(workflow, engine, record):
    """The group of ``record``: ``gconfig.n_samples`` episodes, as the executor runs them."""
    n = workflow.context.gconfig.n_samples
    return asyncio.run(arun_group(workflow, engine, record, n))


def _context(tokenizer: Any, n_samples: int = 1, max_new_tokens: int = 6) -> WorkflowContext:
    g = GenerationConfig(
        n_samples=n_samples, max_new_tokens=max_new_tokens, temperature=TEMPERATURE
    )
    return WorkflowContext(
        tokenizer, g, SamplingParams.from_gconfig(g), [tokenizer.eos_token_id], None
    )


async def two_call_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """Asks, runs its calculator tool, sends the result back as a tool message, asks again."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": record["question"]}]
    first = await client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, max_tokens=6, logprobs=True
    )
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": calculate("37*45")})
    second = await client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, max_completion_tokens=5
    )
    record["replies"].extend([first, second])  # a list the test keeps (records are copied)
    return 0.5


def test_two_call_agent_yields_one_exact_merged_trajectory() -> None:
    model, tokenizer = tiny_model_and_tokenizer(seed=1)
    engine = VersionedTinyEngine(model, tokenizer, bump_every=1)  # each call a new version
    workflow = AgentWorkflow(_context(tokenizer), agent=two_call_agent)
    record: dict[str, Any] = {"question": "What is 37 * 45?", "answer": "1665", "replies": []}
    try:
        group = _run_group(workflow, engine, record)
    finally:
        workflow.close()
    assert group is not None and len(group) == 1
    assert group.stats == {
        "agent/episodes": 1.0,
        "agent/calls": 2.0,
        "agent/untrained_calls": 0.0,
        "agent/budget_ended_episodes": 0.0,
        "agent/tool_episodes": 0.0,  # the tiny model's replies hold no tool call
    }
    traj = group.trajectories[0]
    (req1, out1), (req2, out2) = engine.calls
    assert req1.rid == req2.rid  # a session's calls go under one request id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": record["question"]}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert req1.input_ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    # call 2's prompt: call 1's prompt and completion as generated, then the tool turn
    first_ids = req1.input_ids + out1.output_ids
    assert req2.input_ids[: len(first_ids)] == first_ids
    ended_with_eos = out1.output_ids[-1] == tokenizer.eos_token_id
    tail = tokenizer.decode(req2.input_ids[len(first_ids) :])
    turn_end = "\n" if ended_with_eos else "<|im_end|>\n"
    assert tail == turn_end + "<|im_start|>tool\n1665<|im_end|>\n<|im_start|>assistant\n"
    assert traj.input_ids == req2.input_ids + out2.output_ids
    p1, p2 = len(req1.input_ids), len(req2.input_ids)
    expected_mask = [p1 <= t < len(first_ids) or t >= p2 for t in range(len(traj.input_ids))]
    assert traj.loss_mask == expected_mask and traj.prompt_len == p1 and traj.reward == 0.5
    assert traj.versions[p1 : len(first_ids)] == [0] * len(out1.output_ids)
    assert traj.versions[p2:] == [1] * len(out2.output_ids)
    for version in (0, 1):
        reference = forward_logprobs(
            engine.generator.model, engine.weights[version], traj.input_ids, TEMPERATURE
        )
        at = [t for t, v in enumerate(traj.versions) if v == version]
        assert torch.tensor([traj.logprobs[t] for t in at]) == pytest.approx(
            reference[at], abs=1e-4
        )
    # what the client got: the decoded completion and the sampled tokens' log-probs
    first, second = record["replies"]
    assert first.choices[0].message.content == tokenizer.decode(
        [t for t in out1.output_ids if t != tokenizer.eos_token_id]
    )
    returned = [x.logprob for x in first.choices[0].logprobs.content]
    assert returned == pytest.approx(out1.output_logprobs, abs=1e-6)
    assert second.choices[0].logprobs is None
    assert first.usage.prompt_tokens == p1 and second.usage.completion_tokens == len(
        out2.output_ids
    )


class ScriptedEngine(ScriptOnlyEngine):
    """Returns fixed completions. A random tiny model never writes a well-formed tool call, and
    training one for this test is too slow here, so the tool-call path uses scripted text."""

    version = 7

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.requests = tokenizer, list(texts), []

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False)["input_ids"]
        ids = ids[: request.sampling.max_new_tokens]
        lp = [-0.01 * (i + 1) for i in range(len(ids))]
        finish = "stop" if ids[-1] == self.tokenizer.eos_token_id else "length"
        return ModelResponse(list(request.input_ids), ids, lp, [self.version] * len(ids), finish)


CALL_TEXT = 'Let me. <tool_call>{"name": "calc", "arguments": {"expression": "37*45"}}</tool_call>'


async def tool_using_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """The model asks for the tool; the agent runs it and returns the final answer's reward."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": record["question"]}]
    first = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content == "Let me."
    messages.append(message)  # the pydantic message itself, as agent code usually does
    for call in message.tool_calls or []:
        expression = json.loads(call.function.arguments)["expression"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    final = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
    return 1.0 if final.choices[0].message.content == "1665" else 0.0


def test_tool_call_is_parsed_and_the_conversation_stays_one_trajectory() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = ScriptedEngine(tokenizer, [CALL_TEXT + "<|im_end|>", "1665<|im_end|>"])
    workflow = AgentWorkflow(_context(tokenizer, max_new_tokens=120), agent=tool_using_agent)
    try:
        group = _run_group(workflow, engine, {"question": "37*45?", "answer": "1665"})
    finally:
        workflow.close()
    assert group is not None
    traj = group.trajectories[0]
    assert traj.reward == 1.0 and group.stats["agent/untrained_calls"] == 0
    text = tokenizer.decode(traj.input_ids)
    assert text.endswith(
        "<|im_start|>assistant\n" + CALL_TEXT + "<|im_end|>\n<|im_start|>tool\n1665<|im_end|>\n"
        "<|im_start|>assistant\n1665<|im_end|>"
    )
    masked = tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m])
    assert masked == CALL_TEXT + "<|im_end|>" + "1665<|im_end|>"
    assert set(v for v, m in zip(traj.versions, traj.loss_mask) if m) == {7}


def test_parse_tool_calls_leaves_malformed_calls_in_the_text() -> None:
    content, calls = parse_tool_calls(
        'a <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> b'
    )
    assert content == "a  b" and calls[0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert parse_tool_calls("<tool_call>not json</tool_call>") == (
        "<tool_call>not json</tool_call>",
        [],
    )
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[1] == []


async def branching_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    for question in ("first?", "second?"):  # two unrelated conversations
        await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": question}]
        )
    return 0.0


def test_calls_off_the_last_conversation_are_counted_as_untrained() -> None:
    model, tokenizer = tiny_model_and_tokenizer()
    engine = VersionedTinyEngine(model, tokenizer)
    workflow = AgentWorkflow(_context(tokenizer, n_samples=2), agent=branching_agent)
    try:
        group = _run_group(workflow, engine, {"question": "q", "answer": "1"})
    finally:
        workflow.close()
    assert group is not None and len(group) == 2
    assert group.stats["agent/calls"] == 4 and group.stats["agent/untrained_calls"] == 2
    for traj in group.trajectories:  # the second conversation only
        assert "second?" in tokenizer.decode(traj.input_ids)
        assert "first?" not in tokenizer.decode(traj.input_ids)


def _bad_requests() -> list[tuple[dict[str, Any], type[Exception], str]]:
    user = [{"role": "user", "content": "hi"}]
    return [
        ({"messages": user, "n": 17}, openai.BadRequestError, "n: must be an integer in [1, 16]"),
        ({"messages": []}, openai.BadRequestError, "messages: must be a non-empty list"),
        (
            {"messages": [{"role": "wizard", "content": "x"}]},
            openai.BadRequestError,
            "messages[0].role",
        ),
        ({"messages": user, "temperature": 0.3}, openai.BadRequestError, "gconfig.temperature=0.9"),
        ({"messages": user, "top_p": 0.5}, openai.BadRequestError, "top_p"),
        ({"messages": user, "max_tokens": 999}, openai.BadRequestError, "max_tokens: at most 6"),
        ({"messages": user, "seed": 3}, openai.BadRequestError, "seed: is not supported"),
        (
            {"messages": user, "top_logprobs": 2, "logprobs": True},
            openai.BadRequestError,
            "top_logprobs",
        ),
        (
            {"messages": user, "response_format": {"type": "json_object"}},
            openai.BadRequestError,
            "response_format",
        ),
        (
            {"messages": user, "tool_choice": "required", "tools": TOOLS},
            openai.BadRequestError,
            "tool_choice",
        ),
        (
            {"messages": user, "stop": ["a", "b", "c", "d", "e"]},
            openai.BadRequestError,
            "at most 4 stop",
        ),
        (
            {"messages": user, "extra_body": {"guided_json": {}}},
            openai.BadRequestError,
            "guided_json: is not a known field",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            openai.BadRequestError,
            "only text parts are supported",
        ),
    ]


def test_malformed_requests_get_a_4xx_with_a_message() -> None:
    model, tokenizer = tiny_model_and_tokenizer()
    engine = VersionedTinyEngine(model, tokenizer)
    proxy = AgentProxy(tokenizer, [tokenizer.eos_token_id])
    sampling = SamplingParams(max_new_tokens=6, temperature=TEMPERATURE)

    async def run() -> None:
        session = proxy.open_session(engine, sampling, 6, TEMPERATURE, 1.0)
        client = openai.AsyncOpenAI(
            base_url=session.base_url, api_key=session.api_key, max_retries=0
        )
        for kwargs, error, message in _bad_requests():
            with pytest.raises(error) as caught:
                await client.chat.completions.create(model="policy", **kwargs)
            assert caught.value.status_code == 400
            assert message in caught.value.message, (kwargs, caught.value.message)
        with pytest.raises(openai.BadRequestError, match="stream_options: only with stream"):
            await client.chat.completions.create(
                model="p",
                messages=[{"role": "user", "content": "x"}],
                stream_options={"include_usage": True},
            )
        wrong_key = openai.AsyncOpenAI(base_url=session.base_url, api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError, match="wrong or missing api key"):
            await wrong_key.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "x"}]
            )
        async with httpx.AsyncClient() as http:
            raw = await http.post(
                f"{session.base_url}/chat/completions",
                content=b"{not json",
                headers={"Authorization": f"Bearer {session.api_key}"},
            )
        assert raw.status_code == 400 and "not JSON" in raw.json()["error"]["message"]
        assert [m.id async for m in client.models.list()] == ["policy"]
        assert engine.calls == []  # nothing reached the engine
        proxy.close_session(session)
        with pytest.raises(openai.NotFoundError, match="no open agent session"):
            await client.chat.completions.create(
                model="p", messages=[{"role": "user", "content": "x"}]
            )

    try:
        asyncio.run(run())
    finally:
        proxy.close()


def test_non_loopback_is_refused_by_default() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    with pytest.raises(ValueError, match=r"host: '0.0.0.0' is not a loopback address"):
        AgentProxy(tokenizer, [2], host="0.0.0.0")
    with pytest.raises(ValueError, match="10.0.0.1"):
        AgentWorkflow(_context(tokenizer), agent=two_call_agent, host="10.0.0.1")
    AgentProxy(tokenizer, [2], host="0.0.0.0", allow_non_loopback=True)  # allowed when asked
    proxy = AgentProxy(tokenizer, [2])

    async def ask(peer: str) -> httpx.Response:
        transport = httpx.ASGITransport(app=proxy.app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as http:
            return await http.post("/sessions/abc/v1/chat/completions", json={"messages": []})

    outside = asyncio.run(ask("192.168.1.20"))
    assert (
        outside.status_code == 403 and "loopback clients only" in outside.json()["error"]["message"]
    )
    assert asyncio.run(ask("127.0.0.1")).status_code == 404  # a loopback peer gets through
    assert asyncio.run(ask("::1")).status_code == 404


def test_agent_kwargs_are_checked() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    with pytest.raises(ValueError, match="rollout.workflow_kwargs.agent: required"):
        AgentWorkflow(_context(tokenizer))

    def not_async(base_url: str, api_key: str, record: dict) -> float:
        return 0.0

    with pytest.raises(ValueError, match="must be an async function"):
        AgentWorkflow(_context(tokenizer), agent=not_async)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rollout.workflow_kwargs.agent"):
        AgentWorkflow(_context(tokenizer), agent="no_such_module:agent")


def test_an_engine_failure_reaches_the_agent_and_stops_the_episode_in_one_line() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = ScriptedEngine(tokenizer, [])  # popping from no scripted text raises IndexError
    workflow = AgentWorkflow(_context(tokenizer), agent=tool_using_agent)
    try:
        with pytest.raises(RuntimeError) as caught:
            _run_group(workflow, engine, {"question": "37*45?", "answer": "1665"})
    finally:
        workflow.close()
    message = str(caught.value)
    assert message.startswith("agent tool_using_agent failed on record '37*45?': ")
    assert "InternalServerError" in message and "generation failed: IndexError" in message


def test_the_documented_calculator_agent_uses_its_tool_and_is_rewarded() -> None:
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "calculator_agent.py"
    agent = runpy.run_path(str(example), run_name="calculator_agent")["calculator_agent"]
    tokenizer = tiny_model_and_tokenizer()[1]
    # scripted (see ScriptedEngine): the model calls the tag tool, then copies the result
    engine = ScriptedEngine(tokenizer, ["<calc>347*58</calc>", "20126<|im_end|>"])
    workflow = AgentWorkflow(_context(tokenizer, max_new_tokens=40), agent=agent)
    record = {"question": "What is 347 * 58?", "answer": "20126"}
    try:
        group = _run_group(workflow, engine, record)
    finally:
        workflow.close()
    assert group is not None
    traj = group.trajectories[0]
    assert traj.reward == 1.0 and group.stats["agent/calls"] == 2
    assert [r.sampling.stop for r in engine.requests] == [("</calc>",), ("</calc>",)]
    text = tokenizer.decode(traj.input_ids)
    assert text.endswith(
        "<|im_start|>assistant\n<calc>347*58</calc><|im_end|>\n<|im_start|>user\n"
        "<result>20126</result><|im_end|>\n<|im_start|>assistant\n20126<|im_end|>"
    )


def _port_is_free(port: int) -> bool:
    """Nothing listens on ``port``: a new server can bind it (as the endpoint binds, with
    SO_REUSEADDR, which the closed connections' TIME_WAIT does not block) and connecting
    is refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def _loader_of(record: dict[str, Any]) -> Any:
    class Loader:
        def next_batch(self) -> tuple[list[dict[str, Any]], int]:
            return [dict(record)], 0

    return Loader()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_executor_close_stops_the_agent_endpoint(mode: str) -> None:
    """RolloutExecutor.close() closes the workflow: the endpoint's thread ends, its port is
    free (the thread is a daemon, so without the close it would serve until the process ends)."""
    model, tokenizer = tiny_model_and_tokenizer()
    engine = VersionedTinyEngine(model, tokenizer)
    context = _context(tokenizer)
    workflow = AgentWorkflow(context, agent=one_call_agent)
    record = {"question": "What is 2 + 2?", "answer": "4", "prompt_ids": [5, 6]}
    executor: Any
    if mode == "sync":
        setup = RolloutSetup(engine, workflow, context, 2)
        executor = SyncRolloutExecutor(setup, _loader_of(record), staleness=0, seed=1)
        executor.start(lambda: iter(()), 0)
        executor.next_batch()  # one episode through the endpoint
    else:
        budget = StalenessBudget(1, 1, 0, 1)
        setup = RolloutSetup(engine, workflow, context, 2)
        executor = AsyncRolloutExecutor(setup, budget, _loader_of(record).next_batch)
        executor.start(lambda: iter(engine.generator.model.state_dict().items()), 0)
        executor.next_batch()
    thread, port = workflow.proxy._thread, workflow.proxy.port
    assert thread is not None and thread.is_alive() and not _port_is_free(port)
    executor.close()
    assert not thread.is_alive() and _port_is_free(port)
    assert workflow.proxy._thread is None


async def one_call_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": record["question"]}]
    await client.chat.completions.create(model="policy", messages=messages)  # type: ignore[arg-type]
    return 1.0


def test_agent_evaluation_runs_the_agent_with_greedy_calls() -> None:
    model, tokenizer = tiny_model_and_tokenizer()
    engine = VersionedTinyEngine(model, tokenizer)
    workflow = AgentWorkflow(_context(tokenizer, n_samples=3), agent=two_call_agent)
    record: dict[str, Any] = {"question": "What is 37 * 45?", "answer": "1665", "replies": []}
    try:
        result = asyncio.run(workflow.aevaluate(engine, record))
    finally:
        workflow.close()
    assert result == {
        "correct": 0.0,
        "reward_mean": 0.5,
        "calls_mean": 2.0,
        "tool_use_fraction": 0.0,
    }
    assert len(engine.calls) == 2  # one episode, not n_samples
    assert all(request.sampling.greedy for request, _ in engine.calls)
    assert all(lp == 0.0 for _, out in engine.calls for lp in out.output_logprobs)
