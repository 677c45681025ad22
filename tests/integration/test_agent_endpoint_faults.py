"""The agent endpoint under the calls and model outputs of issue 46, over real HTTP on loopback:
limits before work (413 body, message and character caps, the episode budget from the
characters before tokenising), rendering off the event loop, 4xx for malformed input (non-ASCII
``Authorization`` bytes, deep JSON, lone surrogates, none recorded), and a completion that is
not a well-formed tool call (a thousand nested brackets) returned as text."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import openai
import pytest
from agentic_helpers import VersionedTinyEngine, tiny_model_and_tokenizer
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.rollout.openai.endpoint import AgentProxy
from areal_m2po.rollout.openai.limits import MAX_BODY_BYTES, MAX_CALL_CHARS, MAX_MESSAGES

TEMPERATURE = 0.9
SAMPLING = SamplingParams(max_new_tokens=4, temperature=TEMPERATURE)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer()


class _Endpoint:
    """A started proxy and one open session on a loop of the test's own."""

    def __init__(self, tiny, engine=None, budget=None):
        model, self.tokenizer = tiny
        self.engine = engine or VersionedTinyEngine(model, self.tokenizer)
        self.proxy = AgentProxy(self.tokenizer, [self.tokenizer.eos_token_id])
        self.budget = budget

    def session(self):
        return self.proxy.open_session(self.engine, SAMPLING, 4, TEMPERATURE, 1.0, self.budget)


def _url(session) -> str:
    return f"{session.base_url}/chat/completions"


def _auth(session) -> dict[str, str]:
    return {"Authorization": f"Bearer {session.api_key}"}


def _run(endpoint: _Endpoint, body) -> Any:
    async def go():
        session = endpoint.session()
        try:
            async with httpx.AsyncClient(timeout=120) as http:
                return await body(session, http), session
        finally:
            endpoint.proxy.close_session(session)

    try:
        return asyncio.run(go())
    finally:
        endpoint.proxy.close()


def _user(text: str) -> dict[str, Any]:
    return {"model": "p", "messages": [{"role": "user", "content": text}]}


def test_a_body_over_the_limit_is_a_413_before_it_is_read(tiny):
    async def body(session, http):
        huge = b'{"messages": [{"role": "user", "content": "' + b"a" * MAX_BODY_BYTES + b'"}]}'
        return await http.post(_url(session), content=huge, headers=_auth(session))

    resp, session = _run(_Endpoint(tiny), body)
    assert resp.status_code == 413
    assert f"exceeds the limit of {MAX_BODY_BYTES} bytes" in resp.json()["error"]["message"]
    assert session.calls == []


@pytest.mark.parametrize("kind", ["messages", "chars"])
def test_a_call_over_the_message_or_character_cap_is_a_400(tiny, kind):
    if kind == "messages":
        request = {
            "model": "p",
            "messages": [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1),
        }
        expected = f"{MAX_MESSAGES + 1} messages; at most {MAX_MESSAGES}"
    else:
        request = _user("ab " * (MAX_CALL_CHARS // 3 + 1))
        expected = f"characters of text; at most {MAX_CALL_CHARS} in one call"
    endpoint = _Endpoint(tiny)

    async def body(session, http):
        return await http.post(_url(session), json=request, headers=_auth(session))

    resp, session = _run(endpoint, body)
    assert resp.status_code == 400, resp.text
    assert expected in resp.json()["error"]["message"]
    assert endpoint.engine.calls == [] and session.calls == []


def test_the_episode_budget_is_checked_from_the_characters_before_tokenising(tiny):
    endpoint = _Endpoint(tiny, budget=64)
    calls = []
    real = endpoint.proxy.builder.build
    endpoint.proxy.builder.build = lambda *a: calls.append(1) or real(*a)  # counts renders

    async def body(session, http):
        return await http.post(_url(session), json=_user("q " * 20_000), headers=_auth(session))

    resp, session = _run(endpoint, body)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "the messages hold 39999 characters" in error["message"]
    assert calls == [] and session.budget_refused


def test_a_huge_call_does_not_stall_another_session(tiny):
    """One session's call of ~1.5M characters is rendered and tokenised in the worker thread;
    another session's call sent after it starts is answered before it."""
    endpoint = _Endpoint(tiny)
    order: list[str] = []

    async def body(session, http):
        other = endpoint.session()

        async def huge():
            big = _user("7 " * 750_000)
            resp = await http.post(_url(session), json=big, headers=_auth(session))
            order.append("huge")
            return resp

        async def small():
            await asyncio.sleep(0.5)  # the huge call's body is in and being rendered
            resp = await http.post(_url(other), json=_user("hi"), headers=_auth(other))
            order.append("small")
            return resp

        return await asyncio.gather(huge(), small())

    (big, little), _ = _run(endpoint, body)
    assert little.status_code == 200, little.text
    assert big.status_code == 400  # the tiny model's 512 positions refuse it, after rendering
    assert order == ["small", "huge"]


@pytest.mark.parametrize(
    "content, headers, status, message",
    [
        (
            b'{"model": "p", "messages": [{"role": "user", "content": "x"}]}',
            "bad-auth",
            401,
            "api key",
        ),
        (b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", None, 400, "nested too deeply"),
        (
            b'{"model": "p", "messages": [{"role": "user", "content": "a\\ud800"}]}',
            None,
            400,
            "messages[0].content: not valid Unicode",
        ),
        (
            b'{"model": "\\udfff", "messages": [{"role": "user", "content": "a"}]}',
            None,
            400,
            "model: not valid Unicode",
        ),
    ],
    ids=["non-ascii-auth", "deep-json", "surrogate-content", "surrogate-model"],
)
def test_malformed_input_is_a_4xx_and_never_recorded(tiny, content, headers, status, message):
    endpoint = _Endpoint(tiny)

    async def body(session, http):
        auth = [(b"authorization", b"Bearer \xff\xfe")] if headers else list(_auth(session).items())
        return await http.post(_url(session), content=content, headers=auth)

    resp, session = _run(endpoint, body)
    assert resp.status_code == status, resp.text
    assert message in resp.json()["error"]["message"]
    assert session.calls == [] and endpoint.engine.calls == []


class _ScriptedText(ScriptOnlyEngine):
    """Answers every call with the tokens of ``text``."""

    def __init__(self, tokenizer, text: str) -> None:
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"]

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        n = len(self.ids)
        return ModelResponse.to_request(
            request, self.ids, [-1.0] * n, [0] * n, "stop", time.perf_counter()
        )


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + "[" * 1000 + "</tool_call>",
        '<tool_call>{"name": "calc", "arguments": '
        + "[" * 1000
        + "1"
        + "]" * 1000
        + "}</tool_call>",
        '<tool_call>{"name": "\\ud800"}</tool_call>',
        "<tool_call>{not json</tool_call>",
    ],
    ids=["brackets", "deep-arguments", "surrogate-name", "not-json"],
)
def test_a_malformed_tool_call_in_a_completion_comes_back_as_text(tiny, text):
    model, tokenizer = tiny
    engine = _ScriptedText(tokenizer, text)
    endpoint = _Endpoint(tiny, engine=engine)
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]

    async def body(session, http):
        client = openai.AsyncOpenAI(
            base_url=session.base_url, api_key=session.api_key, max_retries=0
        )
        return await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "go"}], tools=tools
        )

    reply, session = _run(endpoint, body)
    message = reply.choices[0].message
    assert message.tool_calls is None
    assert message.content == tokenizer.decode(engine.ids)
    assert len(session.calls) == 1 and session.calls[0].completion_ids == engine.ids


def test_1100_idle_connections_leave_the_endpoint_answering(tmp_path):
    """The endpoint runs in a child limited to the usual 1,024 descriptors (hard too)."""
    import os
    import resource
    import subprocess
    import sys

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1200:
        pytest.skip("this process may not open the 1,100 connections of the flood")
    script = (
        "import sys\n"
        "from agentic_helpers import tiny_model_and_tokenizer\n"
        "from areal_m2po.rollout.openai.endpoint import AgentProxy\n"
        "tok = tiny_model_and_tokenizer()[1]\n"
        "proxy = AgentProxy(tok, [tok.eos_token_id]); proxy.start()\n"
        "print(proxy.port, flush=True)\n"
        "sys.stdin.read()\n"  # until the test closes our stdin
    )
    child = subprocess.Popen(
        ["bash", "-c", 'ulimit -n 1024 && exec "$@"', "bash", sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(["tests/support", *sys.path])},
    )
    held: list[socket.socket] = []
    try:
        port = int(child.stdout.readline())
        deadline = time.monotonic() + 60
        while len(held) < 1100 and time.monotonic() < deadline:
            s = socket.socket()
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        assert len(held) == 1100
        for _ in range(3):
            with httpx.Client(timeout=10) as probe:  # the trainer's probe timeout
                resp = probe.get(f"http://127.0.0.1:{port}/sessions/none/v1/models")
            assert resp.status_code == 404
        assert child.poll() is None
    finally:
        for s in held:
            s.close()
        child.stdin.close()
        child.wait(timeout=30)
