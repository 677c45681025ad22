"""The HF rollout server only its trainer can drive, over real HTTP on loopback: a key on every
endpoint but ``/health``, weights only from below ``--weights-root``, and every ``/generate``
checked before it is queued (token ids, ``max_new_tokens``, context, JSON, body size), each
refusal a 4xx naming the limit, after which the server answers a good request; one refused
request among eight leaves seven answered, through the server and through the remote engine.
"""

from __future__ import annotations

import asyncio
import os
import secrets

import httpx
import pytest
import torch
from hf_servers import start_tiny_hf_server

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.common.weight_files import write_weights
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.errors import RequestError, ServerError
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine

OOV = 10_000  # builtin:tiny has 99 token ids and 512 positions
BODY_LIMIT = 20_000
GOOD = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One HF server started as the trainer starts it (key in its environment, the weights
    root), with a small body limit: ``(addr, key, weights_root, processes)``."""
    base = tmp_path_factory.mktemp("guarded")
    key = secrets.token_urlsafe(32)
    addr, root, procs = start_tiny_hf_server(
        base, key=key, extra=["--max-body-bytes", str(BODY_LIMIT)]
    )
    yield addr, key, root, procs
    procs.stop()


def _post(addr, endpoint, key=None, **kwargs):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"http://{addr}{endpoint}", headers=headers, timeout=60, **kwargs)


def _message(resp):
    body = resp.json()
    return body["error"]["message"] if "error" in body else body["message"]


def test_every_endpoint_but_health_wants_the_key(server):
    addr, key, _, procs = server
    calls = [
        ("GET", "/get_model_info", None),
        ("POST", "/generate", GOOD),
        ("POST", "/update_weights_from_disk", {"model_path": "/tmp", "weight_version": "1"}),
        ("POST", "/pause_generation", {"mode": "abort"}),
        ("POST", "/continue_generation", {}),
    ]
    for method, endpoint, body in calls:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
            resp = httpx.request(
                method, f"http://{addr}{endpoint}", json=body, headers=headers, timeout=60
            )
            assert resp.status_code == 401, (endpoint, headers, resp.text)
            assert "API key" in _message(resp)
    assert httpx.get(f"http://{addr}/health", timeout=10).status_code == 200  # open
    auth = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"http://{addr}/get_model_info", headers=auth).status_code == 200
    assert _post(addr, "/generate", key, json=GOOD).status_code == 200
    # the key never appears on the server's command line (ps) or in its log
    assert key not in " ".join(procs.procs[0].args)
    with open(procs.logs[0], encoding="utf-8") as log:
        assert key not in log.read()


def test_weights_load_only_from_below_the_root(server, tmp_path):
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import load_causal_lm

    addr, key, root, _ = server
    model = load_causal_lm(resolve_model_path("builtin:tiny"), "float32", "sdpa")
    inside = write_weights(model.state_dict(), root, 7, model.config)
    outside = write_weights(model.state_dict(), str(tmp_path / "elsewhere"), 7, model.config)
    os.symlink(outside, os.path.join(root, "link"))
    for path in (outside, os.path.join(root, "link"), os.path.join(root, "..", "elsewhere")):
        resp = _post(addr, "/update_weights_from_disk", key, json={"model_path": path})
        assert resp.status_code == 403, path
        assert resp.json()["success"] is False
        assert _message(resp) == f"model_path: {path} is not below the server's --weights-root"
    resp = _post(addr, "/update_weights_from_disk", key, json={"model_path": inside})
    assert resp.status_code == 200 and resp.json()["success"] is True
    info = httpx.get(f"http://{addr}/get_model_info", headers={"Authorization": f"Bearer {key}"})
    assert info.json()["weight_version"] == "7"


@pytest.mark.parametrize(
    "kwargs, status, message",
    [
        (
            {"json": {"input_ids": [5, OOV, 7]}},
            400,
            f"input_ids: token id {OOV} at position 1 is outside the vocabulary [0, 99)",
        ),
        (
            {"json": {"input_ids": [5], "sampling_params": {"max_new_tokens": 10**9}}},
            400,
            "sampling_params.max_new_tokens: 1000000000 exceeds the context of 512 tokens "
            "(max_position_embeddings)",
        ),
        (
            {"json": {"input_ids": [5] * 505, "sampling_params": {"max_new_tokens": 8}}},
            400,
            "input_ids: 505 tokens + max_new_tokens 8 exceed the context of 512 tokens "
            "(max_position_embeddings)",
        ),
        (
            {"json": {"input_ids": [5], "sampling_params": {"max_new_tokens": "many"}}},
            400,
            "sampling_params.max_new_tokens: must be an integer, got 'many'",
        ),
        ({"content": b'{"input_ids": [5, 6'}, 400, "the request body is not JSON"),
        ({"json": [5, 6]}, 400, "the request body must be a JSON object, got list"),
        (
            {"json": {"input_ids": [5] * 15_000}},
            413,
            f"bytes exceeds the limit of {BODY_LIMIT} bytes (--max-body-bytes)",
        ),
    ],
    ids=["oov", "huge-max-new-tokens", "prompt-too-long", "not-an-int", "bad-json", "list", "body"],
)
def test_a_bad_generate_request_gets_a_4xx_naming_the_limit_then_a_good_one_is_answered(
    server, kwargs, status, message
):
    addr, key, _, _ = server
    resp = _post(addr, "/generate", key, **kwargs)
    assert resp.status_code == status, resp.text
    assert message in _message(resp)
    assert _post(addr, "/generate", key, json=GOOD).status_code == 200


def _eight_bodies():
    bodies = [
        {"input_ids": [5 + i, 6, 7], "sampling_params": {"max_new_tokens": 3}} for i in range(8)
    ]
    bodies[3] = {"input_ids": [5, OOV, 7], "sampling_params": {"max_new_tokens": 3}}
    return bodies


def test_one_refused_request_among_eight_leaves_seven_answered_over_http(server):
    addr, key, _, _ = server

    async def run():
        auth = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=f"http://{addr}", headers=auth, timeout=60) as http:
            return await asyncio.gather(*(http.post("/generate", json=b) for b in _eight_bodies()))

    replies = asyncio.run(run())
    assert [r.status_code for r in replies] == [200, 200, 200, 400, 200, 200, 200, 200]
    for i, reply in enumerate(replies):
        if i != 3:
            assert 1 <= len(reply.json()["output_ids"]) <= 3


def test_the_remote_engine_sends_the_key_and_a_refusal_fails_one_request(server):
    addr, key, _, _ = server
    engine = RemoteSGLangEngine([addr], RemoteEngineOptions(health_check_interval=60, api_key=key))
    engine.initialize()
    sampling = SamplingParams(max_new_tokens=3, temperature=1.0)
    requests = [ModelRequest(b["input_ids"], sampling) for b in _eight_bodies()]

    async def run():
        return await asyncio.gather(
            *(engine.agenerate(r) for r in requests), return_exceptions=True
        )

    try:
        answers = asyncio.run(run())
        assert engine.metrics()["rollout/n_servers"] == 1  # refused, not dead
        engine.check_health()
    finally:
        engine.destroy()
    assert isinstance(answers[3], RequestError) and answers[3].status == 400
    assert "outside the vocabulary" in str(answers[3])
    assert all(not isinstance(a, BaseException) and a.output_len >= 1 for a in answers[:3])
    assert all(not isinstance(a, BaseException) and a.output_len >= 1 for a in answers[4:])
    assert "api_key" not in repr(engine.options) and key not in repr(engine.options)


def test_a_wrong_key_is_a_server_error_naming_the_key(server):
    addr, _, _, _ = server
    engine = RemoteSGLangEngine([addr], RemoteEngineOptions(health_check_interval=60, api_key="x"))
    engine.initialize()  # /health is open
    try:
        with pytest.raises(ServerError, match=r"/generate refused our API key \(401\)"):
            asyncio.run(engine.agenerate(ModelRequest([5, 6], SamplingParams(max_new_tokens=2))))
    finally:
        engine.destroy()


def test_a_failing_batch_in_the_server_fails_only_the_request_that_fails_alone():
    """The worker's own isolation: a request that reaches ``generate`` (no limits given) with
    an out-of-vocabulary id fails the batched call; the eight are then sampled one by one."""
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import load_causal_lm
    from areal_m2po.rollout.engines.hf_generator import HFGenerator
    from areal_m2po.rollout.servers.hf_server import (
        GenerationWorker,
        RequestFault,
        parse_generate_request,
    )

    local = resolve_model_path("builtin:tiny")
    model = load_causal_lm(local, "float32", "sdpa").eval()
    generator = HFGenerator(model, AutoTokenizer.from_pretrained(local), torch.device("cpu"))
    worker = GenerationWorker(generator)
    try:
        worker.pause()  # queue all eight, then let them run as one batch
        futures = [worker.submit(parse_generate_request(b)) for b in _eight_bodies()]
        worker.resume()
        outcomes = [f.exception(timeout=60) or f.result() for f in futures]
    finally:
        worker.close()
    # an error of the request's kind that fails it alone is the request's fault (a 400)
    assert isinstance(outcomes[3], RequestFault) and "index out of range" in str(outcomes[3])
    for i, out in enumerate(outcomes):
        if i != 3:
            assert isinstance(out, dict) and 1 <= len(out["output_ids"]) <= 3


@pytest.mark.parametrize("endpoint", ["/update_weights_from_disk", "/pause_generation"])
def test_malformed_json_on_the_other_endpoints_is_a_400(server, endpoint):
    addr, key, _, _ = server
    resp = _post(addr, endpoint, key, content=b"{not json")
    assert resp.status_code == 400 and "the request body is not JSON" in _message(resp)
    assert _post(addr, "/generate", key, json=GOOD).status_code == 200
