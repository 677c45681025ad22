"""The rollout server and client: SGLang's protocol over real loopback HTTP.

``SGLANG`` quotes the request/response shapes of SGLang (sgl-project/sglang,
python/sglang/srt/managers/io_struct.py and python/sglang/srt/entrypoints/http_server.py as
stored at commit 001067fffe33427bee0ed2f007fb7551a1d76b44) and the subset AReaL's remote SGLang
engine sends and reads (inclusionAI/AReaL areal/engine/sglang_remote.py, commit
008603bd09f83f19ece2fefa510d08f01a63a38b).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

import httpx
import pytest
import torch
from hf_servers import wait_healthy

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.common.weight_files import read_weights, write_weights
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine, sglang_params

SGLANG = {
    # GenerateReqInput fields (a subset: the ones a text-only RL client can send)
    "generate_request": {
        "rid",
        "text",
        "input_ids",
        "sampling_params",
        "return_logprob",
        "logprob_start_len",
        "top_logprobs_num",
        "return_text_in_logprobs",
        "stream",
        "image_data",
        "lora_path",
    },  # fmt: skip
    # sampling_params keys AReaL sends (plus min_new_tokens, n from SGLang's SamplingParams)
    "sampling_params": {
        "top_p",
        "top_k",
        "max_new_tokens",
        "temperature",
        "stop_token_ids",
        "frequency_penalty",
        "stop",
        "min_new_tokens",
        "n",
    },  # fmt: skip
    # meta_info built by TokenizerManager._handle_batch_output, plus the logprob list
    "meta_info": {"id", "finish_reason", "prompt_tokens", "weight_version"},
    "finish_reason_types": {"stop", "length", "abort"},
    "update_weights_from_disk_request": {
        "model_path",
        "load_format",
        "abort_all_requests",
        "weight_version",
    },  # fmt: skip
    "update_weights_from_disk_response": {"success", "message", "num_paused_requests"},
    "pause_generation_modes": {"abort", "retract", "in_place"},
    "pause_generation_response": {"message": "Generation paused successfully.", "status": "ok"},
    "get_model_info_response": {"model_path", "tokenizer_path", "is_generation", "weight_version"},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from areal_m2po.rollout.servers.launch import HFServerOptions, start_hf_servers

    logs = tmp_path_factory.mktemp("logs")
    procs = start_hf_servers(1, HFServerOptions("builtin:tiny", num_threads=1), str(logs))
    addr = wait_healthy(procs)
    yield addr
    procs.stop()
    assert all(p.poll() is not None for p in procs.procs)


def _post(addr, endpoint, body):
    return httpx.post(f"http://{addr}{endpoint}", json=body, timeout=60)


def _load(path):
    from areal_m2po.engine.train_engine import load_causal_lm

    return load_causal_lm(path, "float32", "sdpa").eval()


def test_generate_shapes_match_sglang(server):
    body = {
        "input_ids": [5, 6, 7, 8],
        "sampling_params": {"max_new_tokens": 5, "temperature": 1.0, "top_k": -1},
        "return_logprob": True,
    }
    assert set(body) <= SGLANG["generate_request"]
    assert set(body["sampling_params"]) <= SGLANG["sampling_params"]
    out = _post(server, "/generate", body).json()
    meta = out["meta_info"]
    assert SGLANG["meta_info"] <= set(meta)
    assert meta["finish_reason"]["type"] in SGLANG["finish_reason_types"]
    pairs = meta["output_token_logprobs"]
    assert len(pairs) == meta["completion_tokens"] == len(out["output_ids"]) <= 5
    for lp, tok, text in pairs:
        assert isinstance(lp, float) and lp <= 0 and isinstance(tok, int) and text is None
    assert [p[1] for p in pairs] == out["output_ids"]
    assert meta["prompt_tokens"] == 4
    info = httpx.get(f"http://{server}/get_model_info").json()
    assert set(info) == SGLANG["get_model_info_response"]
    assert info["weight_version"] == meta["weight_version"]


def test_client_sampling_params_are_sglang_keys():
    from areal_m2po.api.cli_args import GenerationConfig

    def sampling_params(g: GenerationConfig) -> dict:
        return sglang_params(SamplingParams.from_gconfig(g))

    params = sampling_params(GenerationConfig(top_k=5, min_new_tokens=1, stop=["\n"]))
    assert set(params) | {"max_new_tokens"} <= SGLANG["sampling_params"]
    assert params["top_k"] == 5 and params["min_new_tokens"] == 1 and params["stop"] == ["\n"]
    assert sampling_params(GenerationConfig())["top_k"] == -1  # SGLang's "off"
    with_ids = sglang_params(SamplingParams(max_new_tokens=4, stop_token_ids=(7,)))
    assert with_ids["stop_token_ids"] == [7] and set(with_ids) <= SGLANG["sampling_params"]


@pytest.mark.parametrize(
    "body, culprit",
    [
        ({"input_ids": [5, 6], "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"sampling_params": {}}, "input_ids"),
        ({"input_ids": [[5], [6]]}, "input_ids"),
        ({"input_ids": [5], "sampling_params": {"top_p": 2.0}}, "sampling_params.top_p"),
        ({"input_ids": [5], "text": "hi"}, "text"),
    ],
)
def test_bad_generate_request_names_the_field(server, body, culprit):
    resp = _post(server, "/generate", body)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith(culprit)


def test_update_weights_bad_path(server, tmp_path):
    body = {"model_path": str(tmp_path / "missing"), "weight_version": "9"}
    assert set(body) <= SGLANG["update_weights_from_disk_request"]
    resp = _post(server, "/update_weights_from_disk", body)
    assert resp.status_code == 400
    assert set(resp.json()) == SGLANG["update_weights_from_disk_response"]
    assert resp.json()["success"] is False and "missing" in resp.json()["message"]


def test_pause_holds_requests_until_continue(server):
    resp = _post(server, "/pause_generation", {"mode": "abort"})
    assert resp.json() == SGLANG["pause_generation_response"]
    assert _post(server, "/pause_generation", {"mode": "in_place"}).status_code == 400
    body = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 2}}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(_post, server, "/generate", body)
        time.sleep(0.5)
        assert not fut.done()  # queued while paused
        assert _post(server, "/continue_generation", {}).status_code == 200
        assert fut.result(timeout=60).status_code == 200


def _perturbed_state(model, seed):
    gen = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()
    }


def test_logprobs_and_versions_match_a_forward_of_their_version(server, tmp_path):
    """A sample generated at version 0, then (after a weight update) continued at version 1:
    each token carries the version that produced it, and its behaviour log-prob equals a
    forward pass of that version at the sampling temperature (1e-4)."""
    from areal_m2po.engine.builtin_models import resolve_model_path

    temperature = 0.7
    model0 = _load(resolve_model_path("builtin:tiny"))
    model1 = _load(resolve_model_path("builtin:tiny"))
    model1.load_state_dict(_perturbed_state(model0, seed=1))
    state1 = model1.state_dict()  # tied weights agree
    path = write_weights(state1, str(tmp_path / "w"), 1, model0.config)
    loaded, stamp = read_weights(path)
    assert stamp == 1 and torch.equal(loaded["lm_head.weight"], state1["lm_head.weight"])
    prompt = [3, 9, 14, 15, 22]
    write_weights(model0.state_dict(), str(tmp_path / "w"), 0, model0.config)
    engine = RemoteSGLangEngine([server], RemoteEngineOptions(health_check_interval=60))
    engine.initialize()

    def generate(ids, n):
        request = ModelRequest(ids, SamplingParams(max_new_tokens=n, temperature=temperature))
        return asyncio.run(engine.agenerate(request))

    try:
        engine.update_weights_from_disk(str(tmp_path / "w" / "v0"), 0)
        first = generate(prompt, 3)
        engine.update_weights_from_disk(path, 1)  # then continue the sample on version 1
        rest = generate(prompt + first.output_ids, 9)
    finally:
        engine.destroy()
    output_ids = first.output_ids + rest.output_ids
    versions = first.output_versions + rest.output_versions
    n0 = 3
    assert versions[:n0] == [0] * n0 and set(versions[n0:]) <= {1}
    assert len(output_ids) > n0
    ids = torch.tensor([prompt + output_ids])
    got = torch.tensor(first.output_logprobs + rest.output_logprobs)
    for version, model in ((0, model0), (1, model1.eval())):
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
        ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
        mine = torch.tensor(versions) == version
        assert mine.any()
        torch.testing.assert_close(got[mine], ref[mine], atol=1e-4, rtol=0)


def test_interrupted_batch_returns_partial_tokens_with_abort():
    """The server's pause path: a batch cut short returns the tokens made so far, finish
    reason ``abort``, so the client can continue them after the weight update."""
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.rollout.engines.hf_generator import HFGenerator
    from areal_m2po.rollout.servers.hf_server import GenerationWorker, parse_generate_request

    local = resolve_model_path("builtin:tiny")
    engine = HFGenerator(_load(local), AutoTokenizer.from_pretrained(local), torch.device("cpu"))
    worker = GenerationWorker(engine)
    try:
        worker._interrupt.set()  # the state while a weight update with abort_all is pending
        req = parse_generate_request(
            {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 8}, "return_logprob": True}
        )
        out = worker.submit(req).result(timeout=60)
        assert out["meta_info"]["finish_reason"]["type"] in ("abort", "stop")
        if out["meta_info"]["finish_reason"]["type"] == "abort":
            assert 1 <= len(out["output_ids"]) < 8
        worker.resume()
        req = parse_generate_request(
            {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 4}}
        )
        out = worker.submit(req).result(timeout=60)
        assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    finally:
        worker.close()
