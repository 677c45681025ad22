"""The remote engine against real HTTP servers over loopback (``scripted_server``: small
uvicorn servers answering SGLang's and vLLM's calls with scripted replies): which faults mark
a server dead, routing by request id, continuing aborted requests, and the calls of a weight
update for each protocol."""

from __future__ import annotations

import asyncio
import os

import pytest
import torch
from scripted_server import REFUSED_TOKEN, ScriptedServer

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.api.engine_api import RequestError as RefusedRequest
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.errors import RequestError, RolloutServerError, ServerError
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine
from areal_m2po.rollout.engines.remote.vllm import RemoteVLLMEngine

SAMPLING = SamplingParams(max_new_tokens=3)


@pytest.fixture
def servers(request):
    """Two scripted servers (``@pytest.mark.parametrize("servers", [kwargs...], indirect=True)``
    gives each its keyword arguments)."""
    kwargs = getattr(request, "param", [{}, {}])
    started = [ScriptedServer(**kw).start() for kw in kwargs]
    yield started
    for s in started:
        s.stop()


def _engine(servers, tmp_path=None, **options):
    options.setdefault("health_check_interval", 60.0)
    root = str(tmp_path / "weights") if tmp_path is not None else None
    engine = RemoteSGLangEngine(
        [s.addr for s in servers], RemoteEngineOptions(weights_root=root, **options)
    )
    engine.initialize()
    return engine


def _generate(engine, ids, rid=None, sampling=SAMPLING):
    request = (
        ModelRequest(list(ids), sampling)
        if rid is None
        else ModelRequest(list(ids), sampling, rid=rid)
    )
    return asyncio.run(engine.agenerate(request))


@pytest.mark.parametrize("tolerate", [True, False])
def test_a_400_does_not_mark_a_server_dead(servers, tolerate):
    """A refused request is the caller's error: no server is marked dead, the request is not
    sent to the other server, and both serve the next request."""
    engine = _engine(servers, tolerate_server_failures=tolerate)
    try:
        with pytest.raises(RequestError) as info:
            _generate(engine, [1, REFUSED_TOKEN])
        assert info.value.status == 400 and "token id 999 is refused" in str(info.value)
        assert str(info.value).startswith("rollout server 127.0.0.1:")
        assert sum(len(s.endpoints("/generate")) for s in servers) == 1  # not retried
        assert engine.metrics()["rollout/n_servers"] == 2
        engine.check_health()  # the engine still serves
        for start in (1, 20):  # round robin: one request on each server
            assert _generate(engine, [start]).output_ids == [start + 1, start + 2, start + 3]
        assert [len(s.endpoints("/generate")) for s in servers] in ([2, 1], [1, 2])
    finally:
        engine.destroy()


def _vllm_engine(servers, tmp_path, **options):
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama", "tie_word_embeddings": true}')
    options.setdefault("health_check_interval", 60.0)
    opts = RemoteEngineOptions(weights_root=str(tmp_path / "w"), **options)
    engine = RemoteVLLMEngine(
        build_tiny_tokenizer(), str(model_dir), opts, addrs=[s.addr for s in servers]
    )
    engine.initialize()
    return engine


@pytest.mark.parametrize("tolerate", [True, False])
def test_a_400_does_not_mark_a_vllm_server_dead(servers, tmp_path, tolerate):
    """The vLLM backend on the same base: a refused request fails alone, not retried, and both
    servers serve the next requests."""
    engine = _vllm_engine(servers, tmp_path, tolerate_server_failures=tolerate)
    try:
        with pytest.raises(RequestError) as info:
            _generate(engine, [1, REFUSED_TOKEN])
        assert info.value.status == 400 and isinstance(info.value, RefusedRequest)
        assert sum(len(s.endpoints("/inference/v1/generate")) for s in servers) == 1
        assert engine.metrics()["rollout/n_servers"] == 2
        engine.check_health()
        for start in (1, 20):
            assert _generate(engine, [start]).output_ids == [start + 1, start + 2, start + 3]
        assert [len(s.endpoints("/inference/v1/generate")) for s in servers] in ([2, 1], [1, 2])
    finally:
        engine.destroy()


@pytest.mark.parametrize("servers", [[{"fail_with": {"/generate": 500}}, {}]], indirect=True)
def test_a_5xx_marks_the_server_dead_and_the_request_continues_elsewhere(servers):
    engine = _engine(servers, tolerate_server_failures=True)
    try:
        for start in (1, 20, 40):
            assert _generate(engine, [start]).output_ids == [start + 1, start + 2, start + 3]
        assert engine.metrics()["rollout/n_servers"] == 1
        assert len(servers[0].endpoints("/generate")) == 1  # tried once, then dead
    finally:
        engine.destroy()


@pytest.mark.parametrize("servers", [[{"fail_with": {"/generate": 503}}, {}]], indirect=True)
def test_an_untolerated_5xx_stops_the_engine_naming_the_server(servers):
    engine = _engine(servers)
    try:
        with pytest.raises(ServerError) as info:
            _generate(engine, [1])
        assert str(info.value) == (
            f"rollout server {servers[0].addr}: /generate returned 503: "
            '{"error":{"message":"scripted 503"}}'
        )
        with pytest.raises(ServerError):  # and it stays failed
            engine.check_health()
    finally:
        engine.destroy()


def test_an_episode_turns_stay_on_one_server(servers):
    """Every turn of an episode (one request id, a context that grows) goes to the server its
    first turn went to; episodes are spread over both servers."""
    engine = _engine(servers)

    async def episode(rid: str, start: int) -> None:
        ids = [start]
        for _ in range(3):
            out = await engine.agenerate(ModelRequest(list(ids), SAMPLING, rid=rid))
            ids += out.output_ids + [7]  # the environment's reply, then the next turn

    async def run() -> None:
        await asyncio.gather(*(episode(f"episode-{i}", 100 + i) for i in range(6)))

    try:
        asyncio.run(run())
    finally:
        engine.destroy()
    seen = [[body["input_ids"][0] for body in s.endpoints("/generate")] for s in servers]
    for starts in seen:
        assert all(starts.count(x) == 3 for x in set(starts)), seen
    assert sorted(x for starts in seen for x in set(starts)) == list(range(100, 106))
    assert all(seen), "both servers got episodes"


@pytest.mark.parametrize("servers", [[{"abort_first": 1}]], indirect=True)
def test_an_aborted_request_is_continued_with_its_tokens_and_versions(servers):
    """After an ``abort`` the engine resends prompt + tokens so far with the remaining budget,
    and each chunk keeps the weight version the server reported for it."""
    engine = _engine(servers)
    try:
        out = _generate(engine, [7, 8], sampling=SamplingParams(max_new_tokens=6))
    finally:
        engine.destroy()
    first, second = servers[0].endpoints("/generate")
    assert first["input_ids"] == [7, 8] and first["sampling_params"]["max_new_tokens"] == 6
    assert second["input_ids"] == [7, 8, 9, 10]
    assert second["sampling_params"]["max_new_tokens"] == 4
    assert out.output_ids == [9, 10, 11, 12, 13, 14]
    assert out.output_versions == [0, 0, 1, 1, 1, 1]
    assert out.output_logprobs == [-0.5] * 6 and out.finish_reason == "length"


@pytest.mark.parametrize("servers", [[{"version_label": "default"}]], indirect=True)
def test_a_reply_without_an_integer_version_is_a_server_error(servers):
    engine = _engine(servers)
    try:
        with pytest.raises(ServerError, match=r"rollout server .*: meta_info.weight_version"):
            _generate(engine, [1])
    finally:
        engine.destroy()


def _wait(condition, what, timeout=30.0):
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_two_failed_health_probes_keep_a_server_three_drop_it(servers):
    """A server slow to answer /health once or twice (under a flood, say) stays in the pool;
    only PROBES_TO_DROP (3) consecutive failures declare it dead."""
    from areal_m2po.rollout.engines.remote.base import PROBES_TO_DROP

    engine = _engine(servers, health_check_interval=0.02, tolerate_server_failures=True)
    flaky = servers[0]
    try:
        flaky.fail_health_next = PROBES_TO_DROP - 1
        _wait(lambda: flaky.health_refused == PROBES_TO_DROP - 1, "the failed probes")
        probes = len(flaky.endpoints("/health"))
        _wait(lambda: len(flaky.endpoints("/health")) >= probes + 3, "good probes after them")
        assert engine.metrics()["rollout/n_servers"] == 2  # two misses, then good answers
        engine.check_health()
        flaky.health_refused, flaky.fail_health_next = 0, 10**6
        _wait(lambda: engine.metrics()["rollout/n_servers"] == 1, "the server is dropped")
        assert flaky.health_refused == PROBES_TO_DROP  # probing stops once it is dropped
        assert _generate(engine, [1, 2]).output_len == 3  # the other server serves
    finally:
        engine.destroy()


def test_a_server_that_never_answers_health_is_named_at_start(tmp_path):
    from areal_m2po.utils.net import free_port

    addr = f"127.0.0.1:{free_port()}"
    engine = RemoteSGLangEngine([addr], RemoteEngineOptions(setup_timeout=0.2))
    try:
        with pytest.raises(ServerError) as info:
            engine.initialize()
        assert str(info.value) == (
            f"rollout server {addr}: did not answer /health within 0.2s (rollout.setup_timeout)"
        )
    finally:
        engine.destroy()


def test_sglang_weight_update_pauses_loads_and_continues_every_server(servers, tmp_path):
    engine = _engine(servers, tmp_path)
    try:
        engine.update_weights_from_tensors({"w": torch.ones(2)}, version=3)
        assert engine.get_version() == 3
        out = _generate(engine, [1])
    finally:
        engine.destroy()
    for s in servers:
        calls = [endpoint for endpoint, _ in s.calls if endpoint not in ("/health", "/generate")]
        assert calls == ["/pause_generation", "/update_weights_from_disk", "/continue_generation"]
        body = s.endpoints("/update_weights_from_disk")[0]
        assert body["model_path"] == os.path.join(str(tmp_path / "weights"), "v3")
        assert body["weight_version"] == "3" and body["abort_all_requests"] is True
    assert out.output_versions == [3, 3, 3]  # the servers' own stamp
    assert os.listdir(tmp_path / "weights") == ["v3"]


@pytest.mark.parametrize(
    "servers", [[{}, {"fail_with": {"/update_weights_from_disk": 400}}]], indirect=True
)
def test_a_refused_weight_update_stops_the_engine_and_resumes_the_server(servers, tmp_path):
    engine = _engine(servers, tmp_path, tolerate_server_failures=True)
    try:
        with pytest.raises(RequestError, match="/update_weights_from_disk refused"):
            engine.update_weights_from_tensors({"w": torch.ones(2)}, version=1)
        assert engine.get_version() == 0
        assert engine.metrics()["rollout/n_servers"] == 2  # refused, not dead
        # the servers disagree on the weights now: no more rollout, and not one request's
        # refusal (an executor drops a refused request's group and goes on)
        with pytest.raises(RolloutServerError, match="no more rollout") as info:
            engine.check_health()
        assert not isinstance(info.value, RefusedRequest)
    finally:
        engine.destroy()
    assert servers[1].endpoints("/continue_generation")  # not left paused


def test_vllm_protocol_generation_versions_and_weight_update(servers, tmp_path):
    """The vLLM backend on the same base: token-in/token-out generation with the servers'
    version spans, labels at start and on ``set_version``, and the reload sequence."""
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text('{"model_type": "llama", "tie_word_embeddings": true}')
    tokenizer = build_tiny_tokenizer()
    options = RemoteEngineOptions(weights_root=str(tmp_path / "w"), health_check_interval=60.0)
    engine = RemoteVLLMEngine(tokenizer, str(model_dir), options, addrs=[s.addr for s in servers])
    engine.set_version(2)
    engine.initialize()
    try:
        out = asyncio.run(engine.agenerate(ModelRequest([5, 6], SAMPLING)))
        assert out.output_ids == [7, 8, 9] and out.output_versions == [2, 2, 2]
        state = {"model.embed_tokens.weight": torch.ones(4, 2)}
        engine.update_weights_from_tensors(state, version=3)
        assert engine.get_version() == 3
    finally:
        engine.destroy()
    for s in servers:
        calls = [e for e, _ in s.calls if e not in ("/health", "/inference/v1/generate")]
        assert calls == [
            "/update_weight_version",  # labelled at start
            "/pause",
            "/collective_rpc",
            "/reset_prefix_cache",
            "/update_weight_version",
            "/resume",
        ]
        labels = [b["new_version"] for b in s.endpoints("/update_weight_version")]
        assert labels == ["2", "3"]
    sent = (
        servers[0].endpoints("/inference/v1/generate")
        or servers[1].endpoints("/inference/v1/generate")
    )[0]
    assert sent["token_ids"] == [5, 6] and sent["sampling_params"]["max_tokens"] == 3
    assert sent["sampling_params"]["stop_token_ids"] == [tokenizer.eos_token_id]
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "w" / "v3" / "model.safetensors"))
    assert sorted(saved) == ["lm_head.weight", "model.embed_tokens.weight"]  # tied head added
