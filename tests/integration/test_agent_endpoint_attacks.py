"""The agent endpoint under the attacks of issue 57 that a holder of a session key can make,
over real HTTP on loopback: a ~1 MB body of half a million nested elements costs memory in
proportion to its size and leaves another session served; stop strings are limited in length;
the budget pre-check counts assistant text before any rendering and ``n`` renders a prompt
once; ``/v1/responses`` answers a lone surrogate in a field's name with a 400 and echoes at
most a short prefix of a malformed value."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest
from agentic_helpers import VersionedTinyEngine, tiny_model_and_tokenizer

from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.rollout.openai.endpoint import AgentProxy
from areal_m2po.rollout.openai.limits import MAX_STOP_CHARS

TEMPERATURE = 0.9
SAMPLING = SamplingParams(max_new_tokens=4, temperature=TEMPERATURE)
MIB = 1024 * 1024


@pytest.fixture(scope="module")
def tiny():
    return tiny_model_and_tokenizer()


def _user(text: str, **fields: Any) -> dict[str, Any]:
    return {"model": "p", "messages": [{"role": "user", "content": text}], **fields}


def _call(tiny, requests, budget=None, route="chat/completions"):
    """Each body of ``requests`` posted to one session of a fresh endpoint; (the answers, the
    engine, the session, how many prompts were built)."""
    model, tokenizer = tiny
    engine = VersionedTinyEngine(model, tokenizer)
    proxy = AgentProxy(tokenizer, [tokenizer.eos_token_id])
    builds: list[int] = []
    real = proxy.builder.build
    proxy.builder.build = lambda *a: builds.append(1) or real(*a)  # counts renders

    async def go():
        session = proxy.open_session(engine, SAMPLING, 4, TEMPERATURE, 1.0, budget)
        auth = {"Authorization": f"Bearer {session.api_key}"}
        try:
            async with httpx.AsyncClient(timeout=120) as http:
                answers = []
                for body in requests:
                    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
                    url = f"{session.base_url}/{route}"
                    answers.append(await http.post(url, headers=auth, **kwargs))
                return answers, session
        finally:
            proxy.close_session(session)

    try:
        answers, session = asyncio.run(go())
    finally:
        proxy.close()
    return answers, engine, session, len(builds)


_CHILD = """
import asyncio, json, resource, sys
from agentic_helpers import VersionedTinyEngine, tiny_model_and_tokenizer
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.rollout.openai.endpoint import AgentProxy

def vm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1])

async def main():
    model, tok = tiny_model_and_tokenizer()
    engine = VersionedTinyEngine(model, tok)
    proxy = AgentProxy(tok, [tok.eos_token_id])
    sampling = SamplingParams(max_new_tokens=4, temperature=0.9)
    sessions = [proxy.open_session(engine, sampling, 4, 0.9, 1.0) for _ in range(2)]
    # a cap far above the bound checked, so that a regression fails the test, not the machine
    cap = (vm_kib() + 1536 * 1024) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    print(json.dumps([[s.base_url, s.api_key] for s in sessions]), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    proxy.close()

asyncio.run(main())
"""


def _peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


def _nested_body(depth: int, n: int) -> bytes:
    """A chat body whose ``stop`` is ``n`` zeros ``depth`` lists deep (2n + 2 depth bytes)."""
    head = b'{"model": "p", "messages": [{"role": "user", "content": "hi"}], "stop": '
    return head + b"[" * depth + b"0," * (n - 1) + b"0" + b"]" * depth + b"}"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_a_1_mb_body_of_deeply_nested_elements_costs_memory_in_proportion(tmp_path):
    """Old code built a path string per element (each ~2.4 KB at depth 800): about 1.2 GB for
    this 0.96 MB body, every session stalled meanwhile. Now the answer is a 400 for the
    malformed ``stop``, the child's peak memory grows by far less than 200 MB, and another
    session's call made meanwhile is answered."""
    body = _nested_body(800, 480_000)
    assert 0.9 * MIB < len(body) < MIB
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(["tests/support", *sys.path])}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        (url_a, key_a), (url_b, key_b) = json.loads(child.stdout.readline())

        async def go():
            async with httpx.AsyncClient(timeout=120) as http:

                async def post(url, key, **kwargs):
                    auth = {"Authorization": f"Bearer {key}"}
                    return await http.post(f"{url}/chat/completions", headers=auth, **kwargs)

                warm = await post(url_b, key_b, json=_user("hi"))  # everything loaded
                assert warm.status_code == 200, warm.text
                before = _peak_kib(child.pid)
                big, small = await asyncio.gather(
                    post(url_a, key_a, content=body), post(url_b, key_b, json=_user("hello"))
                )
                return before, big, small

        before, big, small = asyncio.run(go())
        grown_mib = (_peak_kib(child.pid) - before) / 1024
        assert big.status_code == 400, big.text[:300]
        assert "stop: must be a non-empty string" in big.json()["error"]["message"]
        assert small.status_code == 200, small.text[:300]
        assert grown_mib < 200, f"peak memory grew by {grown_mib:.0f} MiB"
        assert child.poll() is None
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def test_a_stop_string_over_the_limit_is_a_400_naming_it(tiny):
    """Old code took stop strings of any length (4 x 1,000,000 characters stalled every
    session 37 s); the limit is 256 characters, and a string at the limit is served."""
    over = _user("hi", stop=["ok", "x" * (MAX_STOP_CHARS + 1)])
    at = _user("hi", stop=["x" * MAX_STOP_CHARS])
    (refused, served), engine, session, builds = _call(tiny, [over, at])
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["message"] == (
        f"stop[1]: {MAX_STOP_CHARS + 1} characters; at most {MAX_STOP_CHARS} in a stop string"
    )
    assert served.status_code == 200, served.text
    assert len(engine.calls) == 1 and builds == 1


def test_the_budget_pre_check_counts_assistant_text_before_rendering(tiny):
    """A 40,000-character assistant message (needing 40,000 / longest-token tokens at least)
    against a 64-token budget is refused before any rendering; old code skipped assistant
    text, rendered and tokenised it, and only then refused."""
    request = {
        "model": "p",
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a " * 20_000},
            {"role": "user", "content": "q"},
        ],
    }
    (resp,), engine, session, builds = _call(tiny, [request], budget=64)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "the messages hold 40001 characters" in error["message"]  # 1 + 39999 + 1
    assert builds == 0 and engine.calls == [] and session.budget_refused


def test_n_choices_render_and_tokenise_the_prompt_once(tiny):
    """``n=3``: three engine calls with the same prompt ids from one render (old code
    rendered and tokenised the prompt once per choice)."""
    (resp,), engine, session, builds = _call(tiny, [_user("hello there", n=3)])
    assert resp.status_code == 200, resp.text
    assert [c["index"] for c in resp.json()["choices"]] == [0, 1, 2]
    assert builds == 1
    prompts = [request.input_ids for request, _ in engine.calls]
    assert len(prompts) == 3 and prompts[0] == prompts[1] == prompts[2]
    assert len(session.calls) == 3


def test_a_lone_surrogate_in_a_field_name_is_a_400_on_responses(tiny):
    """The chat route answered this with a 400, ``/v1/responses`` with a 500 and a
    traceback."""
    body = b'{"model": "p", "input": "hi", "bad\\ud800key": 1}'
    (resp,), engine, session, _ = _call(tiny, [body], route="responses")
    assert resp.status_code == 400, resp.text
    assert "not valid Unicode" in resp.json()["error"]["message"]
    assert engine.calls == [] and session.calls == []


@pytest.mark.parametrize(
    "route, body, param",
    [
        (
            "responses",
            {"model": "p", "input": "hi", "previous_response_id": [0] * 300_000},
            "previous_response_id",
        ),
        ("chat/completions", _user("hi", n=[0] * 300_000), "n"),
        ("chat/completions", _user("hi", temperature="t" * 300_000), "temperature"),
        ("responses", {"model": "p", "input": "hi", "k" * 300_000: 1}, "kkk"),
    ],
    ids=["previous-response-id", "n", "temperature", "field-name"],
)
def test_a_malformed_value_is_echoed_by_a_short_prefix(tiny, route, body, param):
    """Old code echoed a 300,000-element ``previous_response_id`` whole: a 4.2 MB error body.
    Every error now holds at most the first 40 characters of a bad value."""
    (resp,), engine, _, _ = _call(tiny, [body], route=route)
    assert resp.status_code == 400, resp.text[:300]
    assert len(resp.content) < 2000, len(resp.content)
    error = resp.json()["error"]
    if param is not None:
        assert error["message"].startswith(param)
    assert engine.calls == []
