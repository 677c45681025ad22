"""vLLM servers as the rollout engine, for real: one server started by the engine, its
log-probs against Hugging Face, a weight update through disk (tied head), the one-line error
of a killed server and no vLLM process left behind."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import time

import httpx
import pytest
import torch
from procs import process_table
from vllm_helpers import hf_token_logprobs, perturbed_state, write_tiny_vllm_model

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.engines.remote.errors import RolloutServerError

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LOGP_TOL = 2e-4
PROMPTS = [[5, 6, 7, 8], [40, 41, 42]]
KEY = secrets.token_urlsafe(32)


def _group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    return [pid for pid, _, state, group in process_table() if state != "Z" and group == pgid]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_vllm_model(str(tmp_path_factory.mktemp("tiny_vllm_srv")))


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def _start_engine(tiny_dir, root):
    """A ``RemoteVLLMEngine`` over one vLLM server it starts itself, with the run's key."""
    from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
    from areal_m2po.rollout.engines.remote.vllm import RemoteVLLMEngine
    from areal_m2po.rollout.servers.launch import VLLMServerOptions, start_vllm_servers
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    weights = str(root / "w")
    servers = VLLMServerOptions(
        model_path=tiny_dir, max_model_len=128, num_threads=1, weights_root=weights
    )
    eng = RemoteVLLMEngine(
        build_tiny_tokenizer(),
        tiny_dir,
        RemoteEngineOptions(weights_root=weights, setup_timeout=900, api_key=KEY),
        processes=start_vllm_servers(1, servers, str(root / "logs"), False, api_key=KEY),
    )
    eng.initialize()
    return eng


@pytest.fixture(scope="module")
def engine(tiny_dir, tmp_path_factory):
    """The module's server, shared by the tests that leave it serving (any order)."""
    eng = _start_engine(tiny_dir, tmp_path_factory.mktemp("srv"))
    yield eng
    eng.destroy()


@pytest.fixture
def engine_to_kill(tiny_dir, tmp_path_factory):
    """A server of its own for the test that kills it, so the shared one outlives any order."""
    eng = _start_engine(tiny_dir, tmp_path_factory.mktemp("srv_killed"))
    yield eng
    eng.destroy()


def _sample(engine, temperature, n=3):
    async def run():
        reqs = [
            ModelRequest(p, SamplingParams(max_new_tokens=8, temperature=temperature))
            for p in PROMPTS
            for _ in range(n)
        ]
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    return asyncio.run(run())


def _max_gap(model, responses, temperature):
    gap = 0.0
    for r in responses:
        ref = hf_token_logprobs(model, r.input_ids, r.output_ids, temperature)
        gap = max(
            gap, float((torch.tensor(r.output_logprobs, dtype=torch.float64) - ref).abs().max())
        )
    return gap


def test_server_logprobs_and_weight_update(engine, hf_model, tiny_dir):
    from transformers import AutoModelForCausalLM

    for temperature in (1.0, 0.7):
        responses = _sample(engine, temperature)
        for r in responses:
            assert r.output_versions == [0] * len(r.output_ids) and r.output_ids
        gap = _max_gap(hf_model, responses, temperature)
        print(f"server, temperature {temperature}: max |vLLM - HF| = {gap:.2e}")
        assert gap < LOGP_TOL

    new_state = perturbed_state(hf_model, scale=0.05, seed=21)  # no lm_head.weight (tied)
    new_model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    new_model.load_state_dict(new_state, strict=False)
    assert _max_gap(new_model, _sample(engine, 1.0), 1.0) > 50 * LOGP_TOL
    engine.update_weights_from_tensors(new_state, version=3)
    assert engine.get_version() == 3
    after = _sample(engine, 1.0)
    for r in after:
        assert r.output_versions == [3] * len(r.output_ids)
    gap = _max_gap(new_model, after, 1.0)
    print(f"server after the update: max |vLLM - HF(new)| = {gap:.2e}")
    assert gap < LOGP_TOL
    # only the newest weight folder is kept
    assert os.listdir(engine.options.weights_root) == ["v3"]


def test_pause_holds_requests_until_resume(engine):
    engine.pause()

    async def run():
        task = asyncio.ensure_future(
            engine.agenerate(ModelRequest(PROMPTS[0], SamplingParams(max_new_tokens=4)))
        )
        await asyncio.sleep(1.0)
        assert not task.done()  # held while paused
        await asyncio.to_thread(engine.resume)
        return await asyncio.wait_for(task, 60)

    response = asyncio.run(run())
    assert len(response.output_ids) >= 1


def test_only_the_key_drives_the_server_and_weights_load_only_from_its_root(
    engine, hf_model, tmp_path
):
    """The server started with the run's key: every endpoint but /health wants it (vLLM's own
    /inference and /v1, the dev-mode weight, pause and RPC endpoints alike), it is on no
    command line and in no log, a weight folder outside --weights-root is refused, and a body
    over the limit gets a 413; the engine then still samples."""
    from areal_m2po.rollout.common.weight_files import write_weights

    addr = engine.addrs[0]
    url = f"http://{addr}"
    calls = [
        ("POST", "/inference/v1/generate", {"token_ids": [5, 6], "sampling_params": {}}),
        ("GET", "/v1/models", None),
        ("POST", "/collective_rpc", {"method": "areal_reload_weights", "kwargs": {"path": "/"}}),
        ("POST", "/pause?mode=abort", None),
        ("POST", "/resume", None),
        ("POST", "/update_weight_version", {"new_version": "99"}),
        ("POST", "/reset_prefix_cache", None),
    ]
    for method, endpoint, body in calls:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            resp = httpx.request(method, url + endpoint, json=body, headers=headers, timeout=60)
            assert resp.status_code == 401, (endpoint, headers, resp.text)
    assert httpx.get(url + "/health", timeout=30).status_code == 200
    proc = engine.processes.procs[0]
    assert KEY not in " ".join(proc.args)
    with open(engine.processes.logs[0], encoding="utf-8") as log:
        assert KEY not in log.read()

    auth = {"Authorization": f"Bearer {KEY}"}
    outside = write_weights(hf_model.state_dict(), str(tmp_path / "elsewhere"), 9)
    rpc = {"method": "areal_reload_weights", "kwargs": {"path": outside}}
    resp = httpx.post(url + "/collective_rpc", json=rpc, headers=auth, timeout=120)
    assert resp.status_code == 500  # vLLM's answer to a failed RPC (paths shown as <path>)
    assert "is not below the server's --weights-root" in resp.json()["error"]["message"]
    # a body over the 16 MiB default is refused from its Content-Length, before it is read
    status_line = _raw_post_head(addr, "/inference/v1/generate", KEY, (64 << 20) + 1)
    assert status_line.startswith("HTTP/1.1 413"), status_line
    version = engine.get_version()
    for answer in _sample(engine, 1.0, n=1):
        assert answer.output_ids and answer.output_versions == [version] * len(answer.output_ids)


def _raw_post_head(addr, path, key, length):
    """The status line of a POST that announces ``length`` bytes and sends none of them."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        )
        sock.sendall(head.encode())
        return sock.makefile("rb").readline().decode().strip()


def test_killed_server_one_line_error_and_no_process_left(engine_to_kill):
    engine = engine_to_kill
    proc = engine.processes.procs[0]
    addr = engine.addrs[0]
    assert len(_group_pids(proc.pid)) >= 2  # API server and engine core
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    with pytest.raises(RolloutServerError) as info:
        _sample(engine, 1.0, n=1)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"rollout server {addr}: vLLM server exited with status -9")
    with pytest.raises(RolloutServerError, match=f"rollout server {addr}"):
        engine.check_health()
    engine.destroy()
    deadline = time.monotonic() + 30
    while _group_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group_pids(proc.pid) == []
