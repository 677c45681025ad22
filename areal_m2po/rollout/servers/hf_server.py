"""A rollout server speaking the subset of SGLang's HTTP protocol that AReaL's remote engine uses.

Endpoints (request/response shapes as in SGLang's ``http_server.py`` / ``io_struct.py``; see
``docs/scaling.md`` for the version checked and what differs):

- ``POST /generate``: ``{"input_ids": [int], "sampling_params": {...}, "return_logprob": bool}``
  -> ``{"text", "output_ids", "meta_info": {"id", "finish_reason": {"type": "stop"|"length"|
  "abort", ...}, "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version",
  "output_token_logprobs": [[logprob, token_id, None], ...]}}``. Every token of one response
  was produced by the single weight version ``weight_version``: a weight update waits for the
  running batch, or (after ``/pause_generation`` or ``abort_all_requests``) cuts it short with
  finish reason ``abort`` and the tokens made so far; the client continues such a request.
- ``POST /update_weights_from_disk``: ``{"model_path", "weight_version", "abort_all_requests"}``
  -> ``{"success", "message", "num_paused_requests"}`` (400 on failure).
- ``POST /pause_generation`` / ``POST /continue_generation``; ``GET /health``;
  ``GET /get_model_info``.

Generation reuses :class:`~areal_m2po.rollout.engines.hf_generator.HFGenerator`, so the
sampled tokens and behaviour log-probs (``log softmax(logits / temperature)``) are computed
exactly as in the in-process (sync) mode. Concurrent requests are queued and drained by one
generation thread, which samples all requests with equal sampling parameters in one batched
``generate`` call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.rollout.engines.hf_generator import HFGenerator
from areal_m2po.rollout.servers.weight_files import read_weights

logger = logging.getLogger("areal_m2po.rollout_server")

__all__ = ["GenerationWorker", "SamplingRequest", "build_app", "parse_generate_request"]

_UNSUPPORTED_ZERO = ("frequency_penalty", "presence_penalty")


@dataclass
class SamplingRequest:
    """One parsed ``/generate`` request (one prompt, one sample)."""

    input_ids: list[int]
    gconfig: GenerationConfig
    greedy: bool
    stop_token_ids: list[int]
    return_logprob: bool
    rid: str
    future: concurrent.futures.Future[dict[str, Any]] = field(
        default_factory=concurrent.futures.Future
    )

    def batch_key(self) -> tuple[Any, ...]:
        g = self.gconfig
        return (
            g.max_new_tokens,
            g.min_new_tokens,
            g.temperature,
            g.top_p,
            g.top_k,
            tuple(g.stop or ()),
            self.greedy,
            tuple(self.stop_token_ids),
        )


def parse_generate_request(body: dict[str, Any]) -> SamplingRequest:
    """Validate a ``/generate`` body; ValueError names the offending field."""
    ids = body.get("input_ids")
    if body.get("text") is not None:
        raise ValueError("text: this server takes token ids only (send input_ids)")
    if not isinstance(ids, list) or not ids:
        raise ValueError("input_ids: must be a non-empty list of token ids")
    if any(isinstance(x, list) for x in ids):
        raise ValueError("input_ids: batched requests are not supported; send one prompt")
    if not all(isinstance(x, int) and x >= 0 for x in ids):
        raise ValueError("input_ids: must hold non-negative integers")
    if body.get("stream"):
        raise ValueError("stream: streaming is not supported")
    sp = dict(body.get("sampling_params") or {})
    if int(sp.get("n", 1)) != 1:
        raise ValueError("sampling_params.n: must be 1 (send one request per sample)")
    for key in _UNSUPPORTED_ZERO:
        if float(sp.get(key) or 0.0) != 0.0:
            raise ValueError(f"sampling_params.{key}: only 0 is supported")
    temperature = float(sp.get("temperature", 1.0))
    greedy = temperature == 0.0
    top_k = int(sp.get("top_k", -1))
    stop = sp.get("stop")
    try:
        gconfig = GenerationConfig(
            n_samples=1,
            max_new_tokens=int(sp.get("max_new_tokens", 128)),
            min_new_tokens=int(sp.get("min_new_tokens", 0)),
            temperature=1.0 if greedy else temperature,
            top_p=float(sp.get("top_p", 1.0)),
            top_k=0 if top_k < 0 else top_k,
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
        )
    except ValueError as exc:
        raise ValueError(f"sampling_params.{exc}") from None
    return_logprob = bool(body.get("return_logprob", False))
    if greedy and return_logprob:
        raise ValueError("return_logprob: not supported with temperature 0 (greedy)")
    stop_ids = sp.get("stop_token_ids") or []
    if not all(isinstance(t, int) for t in stop_ids):
        raise ValueError("sampling_params.stop_token_ids: must be a list of token ids")
    return SamplingRequest(
        input_ids=list(ids),
        gconfig=gconfig,
        greedy=greedy,
        stop_token_ids=list(stop_ids),
        return_logprob=return_logprob,
        rid=str(body.get("rid") or uuid.uuid4().hex),
    )


class _Interrupt:
    """A ``transformers`` stopping criterion that ends a batch when ``flag`` is set."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        return torch.full(
            (input_ids.shape[0],), self.flag.is_set(), dtype=torch.bool, device=input_ids.device
        )


class GenerationWorker:
    """Owns the model; one thread samples queued requests in batches.

    Args:
        engine: the in-process rollout engine whose model serves the requests.
        max_batch: most requests sampled in one ``generate`` call.
        seed: seeds torch's RNG once at start.
    """

    def __init__(self, engine: HFGenerator, max_batch: int = 256, seed: int = 0) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self._queue: queue.Queue[SamplingRequest] = queue.Queue()
        self._model_lock = threading.Lock()
        self._running = threading.Event()  # set: not paused
        self._running.set()
        self._interrupt = threading.Event()  # set: cut the running batch short
        self._closed = threading.Event()
        self._n_in_batch = 0
        torch.manual_seed(seed)
        self._thread = threading.Thread(target=self._loop, name="generation", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    def submit(self, request: SamplingRequest) -> concurrent.futures.Future[dict[str, Any]]:
        self._queue.put(request)
        return request.future

    def pause(self) -> None:
        """Stop generating: the running batch ends now (``abort``), queued requests wait."""
        self._running.clear()
        self._interrupt.set()
        with self._model_lock:  # the running batch has returned
            pass

    def resume(self) -> None:
        self._interrupt.clear()
        self._running.set()

    def update_from_disk(self, path: str, version: int | None, abort_all: bool) -> int:
        """Load a weights directory written by ``weight_files.write_weights``; returns how many
        requests were cut short. The version is the request's, else the file's stamp."""
        state, stamp = read_weights(path)
        if version is None:
            version = stamp
        if version is None:
            raise ValueError(f"weight_version: not given and {path} carries no stamp")
        if stamp is not None and stamp != version:
            raise ValueError(f"weight_version {version} != the version {stamp} stamped in {path}")
        if abort_all:
            self._interrupt.set()
        with self._model_lock:
            cut = self._n_in_batch if abort_all else 0
            self.engine.update_weights(state, version)
        if abort_all and self._running.is_set():
            self._interrupt.clear()
        logger.info("loaded weights version %d from %s", version, path)
        return cut

    def close(self) -> None:
        self._closed.set()
        self._running.set()
        self._thread.join(timeout=10)

    # -- the generation thread ----------------------------------------------------------------

    def _take_batch(self) -> list[SamplingRequest]:
        try:
            first = self._queue.get(timeout=0.1)
        except queue.Empty:
            return []
        jobs = [first]
        while len(jobs) < self.max_batch:
            try:
                jobs.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return jobs

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._running.wait()
            jobs = self._take_batch()
            groups: dict[tuple[Any, ...], list[SamplingRequest]] = {}
            for job in jobs:
                groups.setdefault(job.batch_key(), []).append(job)
            for group in groups.values():
                self._running.wait()  # a pause lands between groups too
                self._run(group)

    def _run(self, jobs: list[SamplingRequest]) -> None:
        from transformers import StoppingCriteriaList

        with self._model_lock:
            self._n_in_batch = len(jobs)
            try:
                batch = self.engine.generate(
                    [j.input_ids for j in jobs],
                    jobs[0].gconfig,
                    greedy=jobs[0].greedy,
                    stop_token_ids=jobs[0].stop_token_ids,
                    stopping_criteria=StoppingCriteriaList([_Interrupt(self._interrupt)]),
                )
                version = self.engine.version
                interrupted = self._interrupt.is_set()
            except Exception as exc:  # report to every waiting request, keep serving
                logger.exception("generation failed")
                for job in jobs:
                    job.future.set_exception(exc)
                return
            finally:
                self._n_in_batch = 0
        for i, job in enumerate(jobs):
            job.future.set_result(self._response(job, batch, i, version, interrupted))

    def _response(
        self,
        job: SamplingRequest,
        batch: dict[str, torch.Tensor],
        row: int,
        version: int,
        interrupted: bool,
    ) -> dict[str, Any]:
        mask = batch["loss_mask"][row]
        out_ids = [int(t) for t in batch["input_ids"][row][mask].tolist()]
        stops = set(self.engine.eos_ids) | set(job.stop_token_ids)
        if out_ids and out_ids[-1] in stops:
            finish: dict[str, Any] = {"type": "stop", "matched": out_ids[-1]}
        elif len(out_ids) >= job.gconfig.max_new_tokens:
            finish = {"type": "length", "length": len(out_ids)}
        elif interrupted:
            finish = {"type": "abort", "message": "paused for a weight update"}
        else:  # ended by a stop string
            finish = {"type": "stop", "matched": None}
        meta: dict[str, Any] = {
            "id": job.rid,
            "finish_reason": finish,
            "prompt_tokens": len(job.input_ids),
            "completion_tokens": len(out_ids),
            "cached_tokens": 0,
            "weight_version": str(version),
        }
        if job.return_logprob:
            lps = batch["behave_logp"][row][mask].tolist()
            meta["output_token_logprobs"] = [[float(lp), t, None] for lp, t in zip(lps, out_ids)]
        text = self.engine.tokenizer.decode(out_ids, skip_special_tokens=True)
        return {"text": text, "output_ids": out_ids, "meta_info": meta}


def _error(message: str, status: int = 400) -> Any:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def build_app(worker: GenerationWorker, model_path: str, tokenizer_path: str) -> Any:
    """The FastAPI application serving ``worker``."""
    app = FastAPI(title="areal_m2po rollout server")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/get_model_info")
    async def model_info() -> dict[str, Any]:
        return {
            "model_path": model_path,
            "tokenizer_path": tokenizer_path,
            "is_generation": True,
            "weight_version": str(worker.version),
        }

    @app.post("/generate")
    async def generate(request: Request) -> Any:
        try:
            job = parse_generate_request(await request.json())
        except ValueError as exc:
            return _error(str(exc))
        try:
            return await asyncio.wrap_future(worker.submit(job))
        except Exception as exc:
            return _error(f"generation failed: {exc}", 500)

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Any:
        body = await request.json()
        path = body.get("model_path")
        raw = body.get("weight_version")
        try:
            if not path:
                raise ValueError("model_path: required")
            version = int(raw) if raw is not None else None
            cut = await asyncio.to_thread(
                worker.update_from_disk, path, version, bool(body.get("abort_all_requests"))
            )
        except (ValueError, OSError, RuntimeError) as exc:
            msg = " ".join(str(exc).split())
            return JSONResponse(
                {"success": False, "message": msg, "num_paused_requests": 0}, status_code=400
            )
        return {
            "success": True,
            "message": f"loaded weight version {worker.version}",
            "num_paused_requests": cut,
        }

    @app.post("/pause_generation")
    async def pause(request: Request) -> Any:
        body = await request.json() if await request.body() else {}
        mode = body.get("mode", "abort")
        if mode != "abort":
            return _error(f"mode: only 'abort' is supported, got {mode!r}")
        await asyncio.to_thread(worker.pause)
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/continue_generation")
    async def resume() -> Any:
        worker.resume()
        return {"message": "Generation continued successfully.", "status": "ok"}

    return app
