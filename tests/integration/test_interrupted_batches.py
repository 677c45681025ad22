"""Batches cut short by a pause: every row gets its own finish reason, ``stop`` before
``abort``, so a row that a stop string ended is complete and never continued, while the rows
that were cut are continued after the resume with their tokens, log-probs and versions intact.
Through our HF rollout server and the remote engine over real loopback HTTP, and through the
in-process HF engine."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import uvicorn
from agentic_helpers import forward_logprobs, tiny_model_and_tokenizer

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.engines.hf import HFInProcessEngine
from areal_m2po.rollout.engines.hf_generator import HFGenerator
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine
from areal_m2po.rollout.servers.hf_server import GenerationWorker, build_app

MAX_NEW = 24
CUT_AT = 4
"""The pause lands while the batch makes its ``CUT_AT``-th token."""


def _greedy(gen: HFGenerator, prompt: list[int], n: int, stop: list[str] | None = None):
    batch = gen.generate(
        [prompt], GenerationConfig(n_samples=1, max_new_tokens=n, stop=stop), greedy=True
    )
    return [int(t) for t in batch["input_ids"][0][batch["loss_mask"][0]].tolist()]


def _two_prompts(gen: HFGenerator) -> tuple[list[int], list[int], str]:
    """Prompts A and B and a stop string: A's greedy completion ends at its first token by the
    stop string; B's greedy completion makes ``MAX_NEW`` tokens without EOS or the stop
    string (found by search over prompts, the model being random)."""
    tok = gen.tokenizer
    prompts = [tok(f"{word} {i}")["input_ids"] for word in ("ab", "xy", "qq") for i in range(12)]
    outs = [_greedy(gen, p, MAX_NEW) for p in prompts]
    for a, out_a in zip(prompts, outs):
        stop = tok.decode(out_a[:1])
        if out_a[0] in gen.eos_ids or not stop.strip() or len(tok(stop)["input_ids"]) != 1:
            continue
        for b, out_b in zip(prompts, outs):
            clean = len(out_b) == MAX_NEW and not set(out_b) & set(gen.eos_ids)
            if clean and stop not in tok.decode(out_b):
                return a, b, stop
    raise AssertionError("no pair of prompts fits the test")


def _pause_at_step(model: torch.nn.Module, step: int, pause: Callable[[], None], cut: Any):
    """A forward hook: at the ``step``-th forward pass, ``pause()`` starts in a thread and the
    pass waits until ``cut`` (a threading.Event the pause sets) is set, so the running batch
    is cut right after that step. Returns (hook handle, the pause thread holder)."""
    calls = {"n": 0}
    started: list[threading.Thread] = []

    def hook(module: Any, args: Any, output: Any) -> None:
        calls["n"] += 1
        if calls["n"] == step:
            thread = threading.Thread(target=pause, daemon=True)
            thread.start()
            started.append(thread)
            assert cut.wait(30), "the pause did not reach the generation"

    return model.register_forward_hook(hook), started


class GatedWorker(GenerationWorker):
    """The server's worker, taking its first batch only once ``expect`` requests have come,
    so they are sampled in one batch (``received`` counts them)."""

    def __init__(self, engine: HFGenerator, expect: int) -> None:
        self.expect, self.received = expect, 0  # before the generation thread starts
        super().__init__(engine)

    def submit(self, request: Any) -> Any:
        future = super().submit(request)
        self.received += 1  # after it is queued
        return future

    def _take_batch(self) -> list[Any]:
        if self.received < self.expect:
            time.sleep(0.01)
            return []
        return super()._take_batch()


class _Served:
    """``build_app(worker)`` served by uvicorn on a loopback port in a thread."""

    def __init__(self, worker: GenerationWorker) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{sock.getsockname()[1]}"
        app = build_app(worker, "tiny", "tiny")
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def test_server_stop_ended_row_in_an_interrupted_batch_is_stop_and_not_continued(tmp_path):
    """Two greedy requests in one batch of our HF server; a pause (the remote engine's, over
    HTTP) cuts the batch after 4 tokens. A, ended by the stop string at its first token,
    comes back ``stop`` with that one token (labelled ``abort`` it would be continued past
    the stop); B comes back ``abort`` and, continued after the resume, equals its
    uninterrupted greedy completion."""
    model, tokenizer = tiny_model_and_tokenizer(0)
    gen = HFGenerator(model, tokenizer, torch.device("cpu"))
    a, b, stop = _two_prompts(gen)
    want_a = _greedy(gen, a, MAX_NEW, [stop])
    want_b = _greedy(gen, b, MAX_NEW, [stop])
    assert len(want_a) == 1 and len(want_b) == MAX_NEW

    worker = GatedWorker(gen, expect=2)
    served = _Served(worker)
    engine = RemoteSGLangEngine(
        [served.addr],
        RemoteEngineOptions(weights_root=str(tmp_path / "w"), health_check_interval=60.0),
    )
    engine.initialize()
    greedy = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0, stop=(stop,))
    hook, pauses = _pause_at_step(gen.model, CUT_AT, engine.pause, worker._interrupt)
    try:
        futures = [
            asyncio.run_coroutine_threadsafe(
                engine.agenerate(ModelRequest(p, greedy)), engine._loop
            )
            for p in (a, b)
        ]
        deadline = time.monotonic() + 60
        while not pauses:
            assert time.monotonic() < deadline, "the batch never reached its 4th step"
            time.sleep(0.01)
        pauses[0].join(60)
        out_a = futures[0].result(60)  # A is done while the engine is still paused
        assert not futures[1].done()  # B waits for the resume to be continued
        engine.resume()
        out_b = futures[1].result(60)
    finally:
        hook.remove()
        engine.destroy()
        served.stop()
        worker.close()
    assert out_a.finish_reason == "stop" and out_a.output_ids == want_a
    assert out_b.finish_reason == "length" and out_b.output_ids == want_b


def test_worker_labels_each_row_of_an_interrupted_batch():
    """The server's replies for one interrupted batch: the stop-ended row ``stop`` (matched
    None: a stop string), the cut row ``abort`` with the tokens made so far."""
    from areal_m2po.rollout.servers.hf_server import parse_generate_request

    model, tokenizer = tiny_model_and_tokenizer(0)
    gen = HFGenerator(model, tokenizer, torch.device("cpu"))
    a, b, stop = _two_prompts(gen)
    want_b = _greedy(gen, b, MAX_NEW)
    worker = GatedWorker(gen, expect=2)
    hook, pauses = _pause_at_step(gen.model, CUT_AT, worker.pause, worker._interrupt)
    try:
        body = {"sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "stop": stop}}
        futures = [worker.submit(parse_generate_request({"input_ids": p, **body})) for p in (a, b)]
        replies = [f.result(60) for f in futures]
    finally:
        hook.remove()
        worker.close()
    assert replies[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": None}
    assert replies[1]["meta_info"]["finish_reason"]["type"] == "abort"
    # the tokens made before the cut, exactly: A and B share their head ("ab "), which the
    # generator prefills in a pass of its own, so the CUT_AT-th pass may make token CUT_AT - 1
    cut = replies[1]["output_ids"]
    assert CUT_AT - 1 <= len(cut) <= CUT_AT and cut == want_b[: len(cut)]


def _run_paused(engine: HFInProcessEngine, requests: list[ModelRequest], between: Any) -> list:
    """``requests`` at once on ``engine``; a pause cuts their batch at its ``CUT_AT``-th
    forward pass, ``between()`` runs while paused, then the engine resumes."""
    paused = threading.Event()

    def pause() -> None:
        engine.pause()
        paused.set()

    async def run() -> list:
        tasks = [asyncio.ensure_future(engine.agenerate(r)) for r in requests]
        while not paused.is_set():
            await asyncio.sleep(0.01)
        between()
        engine.resume()
        return await asyncio.gather(*tasks)

    hook, _ = _pause_at_step(engine.generator.model, CUT_AT, pause, engine._interrupt)
    try:
        return asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        hook.remove()


def test_hf_engine_pause_keeps_a_stop_ended_row_and_continues_the_cut_one():
    """``HFInProcessEngine.pause`` interrupts the running batch (as the interface says): the
    row the stop string ended is ``stop`` with its one token, the cut row is continued after
    the resume into exactly its uninterrupted greedy completion."""
    model, tokenizer = tiny_model_and_tokenizer(0)
    engine = HFInProcessEngine(model, tokenizer, torch.device("cpu"))
    a, b, stop = _two_prompts(engine.generator)
    want_b = _greedy(engine.generator, b, MAX_NEW, [stop])
    greedy = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.0, stop=(stop,))
    out_a, out_b = _run_paused(engine, [ModelRequest(a, greedy), ModelRequest(b, greedy)], dict)
    assert out_a.finish_reason == "stop" and len(out_a.output_ids) == 1
    assert out_b.finish_reason == "length" and out_b.output_ids == want_b


def test_hf_engine_continues_cut_rows_with_exact_logprobs_and_versions():
    """New weights load while the engine is paused; every cut request is continued after the
    resume: the tokens made before the pause are version 0 (``CUT_AT - 1`` of them: the three
    samples share a prefill, the first forward pass), the rest version 1, and each token's
    log-prob is that of its version's weights (an HF forward pass of the whole sequence)."""
    model, tokenizer = tiny_model_and_tokenizer(0)
    engine = HFInProcessEngine(model, tokenizer, torch.device("cpu"))
    _, b, _ = _two_prompts(engine.generator)
    v0 = {k: v.clone() for k, v in engine.generator.model.state_dict().items()}
    noise = torch.Generator().manual_seed(5)
    v1 = {
        k: v + 0.05 * torch.randn(v.shape, generator=noise) if v.is_floating_point() else v
        for k, v in v0.items()
    }
    sampled = SamplingParams(max_new_tokens=MAX_NEW, temperature=0.8)
    torch.manual_seed(0)
    outs = _run_paused(
        engine,
        [ModelRequest(b, sampled) for _ in range(3)],
        lambda: engine.update_weights_from_tensors(v1, 1),
    )
    for out in outs:
        n = len(out.output_ids)
        assert out.finish_reason in ("stop", "length") and n > CUT_AT
        assert out.output_versions == [0] * (CUT_AT - 1) + [1] * (n - CUT_AT + 1)
        ids, p = list(out.input_ids) + list(out.output_ids), len(out.input_ids)
        for version, weights in ((0, v0), (1, v1)):
            at = [p + t for t, v in enumerate(out.output_versions) if v == version]
            reference = forward_logprobs(engine.generator.model, weights, ids, 0.8)
            got = torch.tensor([out.output_logprobs[t - p] for t in at])
            assert got == pytest.approx(reference[at], abs=1e-4)
