"""The HF rollout server under the requests, loads and floods of issue 46, over real HTTP on
loopback: what is the request's fault is a 4xx checked on arrival (never a 500, never a
traceback, never a dead server in the remote engine); a weight load is all or nothing, from
resolved files below ``--weights-root`` only; 1,100 idle connections to a server limited to
1,024 descriptors leave ``/health`` answering within the trainer's probe timeout."""

from __future__ import annotations

import asyncio
import os
import resource
import secrets
import socket
import time

import httpx
import pytest
import torch
from hf_servers import start_tiny_hf_server

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.common.weight_files import WEIGHTS_FILE, write_weights
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.errors import RequestError
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine

GOOD = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}
PROBE_TIMEOUT_S = 10.0  # rollout.health_check_timeout's default


def _start(base, extra=(), wrap=(), key=None):
    """One HF server as the trainer starts it, its command wrapped by ``wrap``."""
    return start_tiny_hf_server(base, key=key, extra=extra, wrap=wrap)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    key = secrets.token_urlsafe(32)
    addr, root, procs = _start(tmp_path_factory.mktemp("faults"), key=key)
    yield addr, key, root
    procs.stop()


@pytest.fixture(scope="module")
def tiny_state():
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import load_causal_lm

    model = load_causal_lm(resolve_model_path("builtin:tiny"), "float32", "sdpa")
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config


def _post(addr, endpoint, key, **kwargs):
    auth = {"Authorization": f"Bearer {key}"}
    return httpx.post(f"http://{addr}{endpoint}", headers=auth, timeout=60, **kwargs)


def _info(addr, key):
    auth = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"http://{addr}/get_model_info", headers=auth, timeout=30).json()


def _sp(**params):
    return {"json": {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3, **params}}}


DEEP = b'{"input_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (_sp(stop=["\u20ac"]), "sampling_params.stop: the tokenizer cannot match"),
        (_sp(temperature=1e-300), "sampling_params.temperature: must be 0 (greedy) or in"),
        (_sp(stop_token_ids=[10**30]), "sampling_params.stop_token_ids[0]: must be a token id"),
        (_sp(stop=5), "sampling_params.stop: must be a string or a list"),
        (_sp(top_k=10**30), "sampling_params.top_k: must lie in"),
        (
            {"content": b'{"input_ids": [5], "sampling_params": {"temperature": 1e400}}'},
            "sampling_params.temperature: must be finite",
        ),
        ({"content": DEEP}, "the request body is not JSON (nested too deeply)"),
        ({"content": b'{"input_ids": [5, 6], "rid": "\\ud800"}'}, "rid: not valid Unicode"),
        ({"content": b'{"input_ids": [' + b"9" * 5000 + b"]}"}, "the request body is not JSON"),
    ],
    ids=[
        "euro-stop",
        "tiny-temperature",
        "huge-stop-id",
        "stop-int",
        "huge-top-k",
        "inf-temperature",
        "deep-json",
        "surrogate-rid",
        "long-int",
    ],
)
def test_a_request_generation_would_refuse_is_a_400_on_arrival(server, kwargs, message):
    addr, key, _ = server
    resp = _post(addr, "/generate", key, **kwargs)
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"]["message"]
    assert "Traceback" not in resp.text
    assert _post(addr, "/generate", key, json=GOOD).status_code == 200


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_new_tokens=3, temperature=1.0, stop=("\u20ac",)),
        SamplingParams(max_new_tokens=3, temperature=1e-300),
        SamplingParams(max_new_tokens=3, temperature=1.0, stop_token_ids=(10**30,)),
    ],
    ids=["euro-stop", "tiny-temperature", "huge-stop-id"],
)
def test_the_remote_engine_keeps_a_server_that_refuses_a_request(server, sampling):
    addr, key, _ = server
    engine = RemoteSGLangEngine([addr], RemoteEngineOptions(health_check_interval=60, api_key=key))
    engine.initialize()
    try:
        with pytest.raises(RequestError) as caught:
            asyncio.run(engine.agenerate(ModelRequest([5, 6, 7], sampling)))
        assert caught.value.status == 400
        assert engine.metrics()["rollout/n_servers"] == 1
        engine.check_health()
        good = asyncio.run(engine.agenerate(ModelRequest([5, 6], SamplingParams(max_new_tokens=2))))
        assert good.output_len >= 1
    finally:
        engine.destroy()


def _load(addr, key, body):
    return _post(addr, "/update_weights_from_disk", key, json=body)


@pytest.mark.parametrize(
    "version, message",
    [
        ([1, 2], "weight_version: must be an integer in [0, 2**63), got [1, 2]"),
        ("1" * 40, "weight_version: must be an integer in [0, 2**63), got '11111"),
        (-3, "weight_version: must be an integer in [0, 2**63), got -3"),
        (True, "weight_version: must be an integer in [0, 2**63), got True"),
    ],
    ids=["list", "40-digits", "negative", "bool"],
)
def test_a_malformed_weight_version_is_a_400(server, tiny_state, version, message):
    addr, key, root = server
    path = write_weights(tiny_state[0], root, 3, tiny_state[1])
    before = _info(addr, key)["weight_version"]
    resp = _load(addr, key, {"model_path": path, "weight_version": version})
    assert resp.status_code == 400 and message in resp.json()["message"], resp.text
    assert _info(addr, key)["weight_version"] == before


def test_an_infinite_weight_version_and_a_surrogate_path_are_400s(server):
    addr, key, root = server
    raw = b'{"model_path": "%s", "weight_version": 1e400}' % root.encode()
    resp = _post(addr, "/update_weights_from_disk", key, content=raw)
    assert resp.status_code == 400 and "weight_version: must be an integer" in resp.text
    resp = _post(addr, "/update_weights_from_disk", key, content=b'{"model_path": "/tmp/\\udc80x"}')
    assert resp.status_code == 400 and "model_path: not valid Unicode" in resp.text


def _bad_state(kind, state):
    bad = {k: v.clone() for k, v in state.items()}
    name = next(k for k in bad if k.endswith("weight") and bad[k].dim() == 2)
    if kind == "shape-1":
        bad[name] = torch.zeros(1)
    elif kind == "nan":
        bad[name][0, 0] = float("nan")
    elif kind == "missing":
        del bad[name]
    elif kind == "unknown":
        bad["extra.weight"] = torch.zeros(2)
    return bad, name


@pytest.mark.parametrize("kind", ["shape-1", "nan", "missing", "unknown", "corrupt"])
def test_a_refused_load_leaves_the_old_weights_and_version(server, tiny_state, kind):
    addr, key, root = server
    state, config = tiny_state
    good = write_weights(state, root, 11, config)
    assert _load(addr, key, {"model_path": good, "weight_version": 11}).status_code == 200
    greedy = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    before = _post(addr, "/generate", key, json=greedy).json()["output_ids"]
    if kind == "corrupt":
        path = os.path.join(root, "corrupt")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, WEIGHTS_FILE), "wb") as fh:
            fh.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{not safetensors")
    else:
        # a changed model under the bad tensor: a half-applied load would change the output
        changed = {k: v + 0.5 if v.is_floating_point() else v for k, v in state.items()}
        bad, _ = _bad_state(kind, changed)
        path = write_weights(bad, root, 12, config)
    resp = _load(addr, key, {"model_path": path, "weight_version": 12})
    assert resp.status_code == 400, resp.text
    assert resp.json()["success"] is False and "Traceback" not in resp.text
    assert _info(addr, key)["weight_version"] == "11"
    assert _post(addr, "/generate", key, json=greedy).json()["output_ids"] == before


def test_a_weights_file_linking_outside_the_root_is_refused(server, tiny_state, tmp_path):
    addr, key, root = server
    state, config = tiny_state
    outside = write_weights(state, str(tmp_path / "elsewhere"), 9, config)
    folder = os.path.join(root, "v9")  # a real folder under the root ...
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, WEIGHTS_FILE)
    if os.path.lexists(target):
        os.remove(target)
    os.symlink(os.path.join(outside, WEIGHTS_FILE), target)  # ... whose file links outside
    before = _info(addr, key)["weight_version"]
    resp = _load(addr, key, {"model_path": folder, "weight_version": 9})
    assert resp.status_code == 403, resp.text
    assert "resolves outside the server's --weights-root" in resp.json()["message"]
    assert _info(addr, key)["weight_version"] == before


def test_log_level_trace_starts_the_server(tmp_path):
    addr, _, procs = _start(tmp_path, extra=["--log-level", "trace"])
    try:
        assert httpx.get(f"http://{addr}/health", timeout=10).status_code == 200
    finally:
        procs.stop()


def _raise_own_file_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need:
        pytest.skip(f"this process may open only {hard} files; the flood needs {need}")


def hold_idle_connections(addr: str, n: int, deadline_s: float = 60.0) -> list[socket.socket]:
    """``n`` TCP connections to ``addr`` that send nothing (loopback; the caller closes them).
    Stops early past ``deadline_s``."""
    host, port = addr.rsplit(":", 1)
    held, stop = [], time.monotonic() + deadline_s
    while len(held) < n and time.monotonic() < stop:
        s = socket.socket()
        s.settimeout(5)
        try:
            s.connect((host, int(port)))
        except OSError:
            s.close()
            continue
        held.append(s)
    return held


def test_1100_idle_connections_leave_health_answering(tmp_path):
    """The server is given the usual 1,024-descriptor limit (hard too, so it cannot raise it):
    without a cap, accepting 1,100 idle connections exhausts it and ``/health`` times out."""
    _raise_own_file_limit(1200)
    wrap = ["bash", "-c", 'ulimit -n 1024 && exec "$@"', "bash"]
    addr, _, procs = _start(tmp_path, wrap=wrap)
    held = hold_idle_connections(addr, 1100)
    try:
        assert len(held) == 1100
        for _ in range(3):  # a fresh connection each time, as the trainer's probe may open
            with httpx.Client(timeout=PROBE_TIMEOUT_S) as probe:
                assert probe.get(f"http://{addr}/health").status_code == 200
        procs.check_alive()
    finally:
        for s in held:
            s.close()
        procs.stop()


def test_the_default_body_limit_refuses_a_body_over_16_mib_before_reading_it(server):
    """The default (no --max-body-bytes) is 16 MiB: a body just under it is parsed well within
    the trainer's 10 s probe timeout (measured: /health answered within 0.6 s during a 15.9 MiB
    body, against 6.2 s during a 58 MiB body under the old 64 MiB default). A larger body is
    refused from its announced length, before any of it is sent."""
    addr, key, _ = server
    host, port = addr.rsplit(":", 1)
    length = 16 * 1024 * 1024 + 1
    head = (
        f"POST /generate HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head)
        reply = ""
        while "}}" not in reply:  # the status line and headers, then the JSON body
            chunk = sock.recv(4096).decode("latin-1")
            if not chunk:
                break
            reply += chunk
    assert reply.startswith("HTTP/1.1 413"), reply
    assert f"exceeds the limit of {length - 1} bytes" in reply
