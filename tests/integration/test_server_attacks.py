"""The HF rollout server under the attacks of issue 57 that a holder of the server key can
make, over real HTTP on loopback: stop strings at the limits keep no per-vocabulary table; a
minimum length with every token a stop token is a 400 (and the remote engine keeps the
server); a weights file cut short or copied over while it loads is refused, never a SIGBUS; a
weights file swapped for a link to outside the root after its check is never read."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import shutil
import threading
import time

import httpx
import pytest
import torch
from hf_servers import start_tiny_hf_server
from inprocess_server import serve_tiny

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.common import weight_files
from areal_m2po.rollout.common.guard import below_root
from areal_m2po.rollout.common.weight_files import WEIGHTS_FILE, write_weights
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.errors import RequestError
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine

GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("attacks") / "rollout_weights")
    os.makedirs(root)
    with serve_tiny(root) as served:
        yield served


def _generate(server, **params):
    body = {"input_ids": [5, 6, 7], "sampling_params": {**GREEDY, **params}}
    return server.post("/generate", json=body)


def test_stop_strings_at_the_limits_keep_no_vocabulary_table(server):
    """Eight requests of 16 distinct 256-character stop strings are answered and leave
    transformers' cache of per-vocabulary stop tables empty (old code kept the last 8, each
    vocabulary x strings x length); a stop string from the greedy text still ends it there."""
    from transformers.generation import stopping_criteria

    stopping_criteria.STOP_STRING_EMBEDDING_CACHE.clear()
    for k in range(8):
        stops = [f"{k}-{i}-" + "z" * 250 for i in range(16)]
        resp = _generate(server, stop=stops)
        assert resp.status_code == 200, resp.text
    assert len(stopping_criteria.STOP_STRING_EMBEDDING_CACHE) == 0
    plain = _generate(server).json()
    ids = plain["output_ids"]
    tokenizer = server.worker.engine.tokenizer
    stop = tokenizer.decode(ids[2:4])  # the text of the 3rd and 4th tokens
    stopped = _generate(server, stop=[stop]).json()
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": None}
    assert stop in tokenizer.decode(stopped["output_ids"])
    assert (
        len(stopped["output_ids"]) <= 4
        and stopped["output_ids"] == ids[: len(stopped["output_ids"])]
    )


def test_min_new_tokens_with_every_token_a_stop_is_a_400(server):
    """Old code sampled from no token: a 500 "probability tensor contains inf/nan"."""
    vocab = server.worker.engine.model.config.vocab_size
    resp = _generate(server, temperature=1.0, min_new_tokens=2, stop_token_ids=list(range(vocab)))
    assert resp.status_code == 400, resp.text
    message = resp.json()["error"]["message"]
    assert message == (
        f"sampling_params.min_new_tokens: 2 with stop_token_ids and EOS covering all {vocab} "
        "token ids leaves no token to sample"
    )
    engine = RemoteSGLangEngine(
        [server.addr], RemoteEngineOptions(health_check_interval=60, api_key=server.key)
    )
    engine.initialize()
    try:
        sampling = SamplingParams(
            max_new_tokens=3, min_new_tokens=2, stop_token_ids=tuple(range(vocab))
        )
        with pytest.raises(RequestError) as caught:
            asyncio.run(engine.agenerate(ModelRequest([5, 6, 7], sampling)))
        assert caught.value.status == 400
        assert engine.metrics()["rollout/n_servers"] == 1
        good = asyncio.run(engine.agenerate(ModelRequest([5, 6], SamplingParams(max_new_tokens=2))))
        assert good.output_len >= 1
    finally:
        engine.destroy()


def _tiny_state(builtin: bool = False):
    """(the state dict, config) of the in-process server's model, or of ``builtin:tiny``."""
    if builtin:
        from areal_m2po.engine.builtin_models import resolve_model_path
        from areal_m2po.engine.train_engine import load_causal_lm

        model = load_causal_lm(resolve_model_path("builtin:tiny"), "float32", "sdpa")
    else:
        from agentic_helpers import tiny_model_and_tokenizer

        model = tiny_model_and_tokenizer()[0]
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config


def test_a_file_swapped_for_an_outside_link_after_its_check_is_never_read(
    server, tmp_path, monkeypatch
):
    """The attacker wins the race every time: right after the check says the file lies below
    the root, it becomes a link to a file outside (stamped version 77, other weights). Old code
    opened the path again and served the outside file; now the file checked is the file read."""
    served, config = _tiny_state()
    state = {k: v + 0.25 if v.is_floating_point() else v for k, v in served.items()}
    inside = write_weights(state, server.root, 7, config)
    changed = {k: v + 0.5 if v.is_floating_point() else v for k, v in served.items()}
    outside = write_weights(changed, str(tmp_path / "outside"), 77, config)
    file = os.path.join(inside, WEIGHTS_FILE)
    kept = os.path.join(str(tmp_path), "kept.safetensors")
    shutil.copyfile(file, kept)

    def swap() -> None:
        if os.path.islink(file):
            return
        os.remove(file)
        os.symlink(os.path.join(outside, WEIGHTS_FILE), file)

    def racing(path, root):
        ok = below_root(path, root)
        if str(path).endswith(".safetensors"):
            swap()
        return ok

    # wherever the server checks a weights file against the root (old code: weight_files)
    modules = [weight_files]
    with contextlib.suppress(ImportError):
        modules.append(importlib.import_module("areal_m2po.rollout.common.weight_reader"))
    for module in modules:
        if hasattr(module, "below_root"):
            monkeypatch.setattr(module, "below_root", racing)
    resp = server.post("/update_weights_from_disk", json={"model_path": inside})
    monkeypatch.undo()
    assert resp.status_code == 200, resp.text
    assert resp.json()["message"] == "loaded weight version 7"
    own = server.worker.engine.model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in state.items() if k in own)
    os.remove(file)
    shutil.copyfile(kept, file)


def _start_server(base):
    """One HF server process as the trainer starts it (a SIGBUS would kill it, not pytest)."""
    key = "s" * 32
    addr, root, procs = start_tiny_hf_server(base, key=key)
    return addr, key, root, procs


def _cut_and_copy_back(file: str, full: str, stop: threading.Event) -> None:
    """Until ``stop``: cut ``file`` to 1 MiB, then ``cp`` the full file over it in place."""
    while not stop.is_set():
        os.truncate(file, 1 << 20)
        time.sleep(0.002)
        shutil.copyfile(full, file)
        time.sleep(0.002)


def test_a_weights_file_cut_short_while_it_loads_is_refused_and_the_server_lives(tmp_path):
    """A 48 MB weights file is cut to 1 MiB and copied back in place (``cp``) in a loop while
    the server loads it: old code read it through a mapping and died of SIGBUS (exit 135).
    Every load now answers a 4xx (the file's extra tensor, or its change while read), the
    server stays up, and a good load afterwards is served."""
    addr, key, root, procs = _start_server(tmp_path)
    auth = {"Authorization": f"Bearer {key}"}
    state, config = _tiny_state(builtin=True)
    try:
        big = write_weights({**state, "extra.weight": torch.zeros(12 * 1024 * 1024)}, root, 5)
        file = os.path.join(big, WEIGHTS_FILE)
        full = str(tmp_path / "full.safetensors")
        shutil.copyfile(file, full)
        stop = threading.Event()
        cutter = threading.Thread(target=_cut_and_copy_back, args=(file, full, stop), daemon=True)
        cutter.start()
        statuses = []
        deadline = time.monotonic() + 20
        try:
            while len(statuses) < 40 and time.monotonic() < deadline:
                resp = httpx.post(
                    f"http://{addr}/update_weights_from_disk",
                    headers=auth,
                    json={"model_path": big, "weight_version": 5},
                    timeout=60,
                )
                statuses.append(resp.status_code)
                assert 400 <= resp.status_code < 500, resp.text
        finally:
            stop.set()
            cutter.join(timeout=10)
        assert procs.procs[0].poll() is None
        assert len(statuses) >= 5
        good = write_weights(state, root, 6, config)
        resp = httpx.post(
            f"http://{addr}/update_weights_from_disk",
            headers=auth,
            json={"model_path": good, "weight_version": 6},
            timeout=60,
        )
        assert resp.status_code == 200, resp.text
    finally:
        procs.stop()
