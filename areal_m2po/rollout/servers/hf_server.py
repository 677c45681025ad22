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
  -> ``{"success", "message", "num_paused_requests"}`` (400 on failure, 403 for a path outside
  ``--weights-root``).
- ``POST /pause_generation`` / ``POST /continue_generation``; ``GET /health``;
  ``GET /get_model_info``.

Generation reuses :class:`~areal_m2po.rollout.engines.hf_generator.HFGenerator`, so the
sampled tokens and behaviour log-probs (``log softmax(logits / temperature)``) are computed
exactly as in the in-process (sync) mode. Concurrent requests are queued and drained by one
generation thread, which samples all requests with equal sampling parameters in one batched
``generate`` call; when that call fails, each of its requests is sampled alone, so only a
request that fails alone gets a 500.

Only its trainer drives it (:class:`ServerLimits`): every endpoint but ``/health`` wants the
API key, weights load only from below ``--weights-root``, and each ``/generate`` is checked
before it is queued: a body that is not a JSON object, token ids outside the vocabulary,
``max_new_tokens`` or a prompt that does not fit the context, and a body over
``--max-body-bytes`` each get a 4xx naming the limit (:mod:`.guard`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
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
from areal_m2po.rollout.common.guard import DEFAULT_MAX_BODY_BYTES, ServerGuard, below_root
from areal_m2po.rollout.common.weight_files import read_weights
from areal_m2po.rollout.engines.hf_generator import HFGenerator, StopWhenSet
from areal_m2po.rollout.engines.request_batcher import answer_each
from areal_m2po.rollout.engines.request_limits import RequestLimits

logger = logging.getLogger("areal_m2po.rollout_server")

__all__ = [
    "GenerationWorker",
    "SamplingRequest",
    "ServerLimits",
    "build_app",
    "parse_generate_request",
]

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


def _int(sp: dict[str, Any], key: str, default: int) -> int:
    value = sp.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"sampling_params.{key}: must be an integer, got {value!r}")
    return value


def _float(sp: dict[str, Any], key: str, default: float) -> float:
    value = sp.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"sampling_params.{key}: must be a number, got {value!r}")
    return float(value)


def parse_generate_request(body: Any, limits: RequestLimits | None = None) -> SamplingRequest:
    """Validate a ``/generate`` body against the server's ``limits`` (token ids inside the
    vocabulary; prompt plus ``max_new_tokens`` inside the context); ValueError names the
    offending field and the limit."""
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object, got {type(body).__name__}")
    ids = body.get("input_ids")
    if body.get("text") is not None:
        raise ValueError("text: this server takes token ids only (send input_ids)")
    if not isinstance(ids, list) or not ids:
        raise ValueError("input_ids: must be a non-empty list of token ids")
    if any(isinstance(x, list) for x in ids):
        raise ValueError("input_ids: batched requests are not supported; send one prompt")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise ValueError("input_ids: must hold integers")
    if body.get("stream"):
        raise ValueError("stream: streaming is not supported")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ValueError("sampling_params: must be an object")
    if _int(sp, "n", 1) != 1:
        raise ValueError("sampling_params.n: must be 1 (send one request per sample)")
    for key in _UNSUPPORTED_ZERO:
        if _float(sp, key, 0.0) != 0.0:
            raise ValueError(f"sampling_params.{key}: only 0 is supported")
    temperature = _float(sp, "temperature", 1.0)
    greedy = temperature == 0.0
    top_k = _int(sp, "top_k", -1)
    max_new_tokens = _int(sp, "max_new_tokens", 128)
    if (
        limits is not None
        and limits.context_len is not None
        and max_new_tokens > limits.context_len
    ):
        raise ValueError(
            f"sampling_params.max_new_tokens: {max_new_tokens} exceeds the context of "
            f"{limits.context_len} tokens ({limits.context_name})"
        )
    stop = sp.get("stop")
    try:
        gconfig = GenerationConfig(
            n_samples=1,
            max_new_tokens=max_new_tokens,
            min_new_tokens=_int(sp, "min_new_tokens", 0),
            temperature=1.0 if greedy else temperature,
            top_p=_float(sp, "top_p", 1.0),
            top_k=0 if top_k < 0 else top_k,
            stop=[stop] if isinstance(stop, str) else (list(stop) if stop else None),
        )
    except ValueError as exc:
        raise ValueError(f"sampling_params.{exc}") from None
    if limits is not None:
        reason = limits.refusal(ids, max_new_tokens)
        if reason is not None:
            raise ValueError(reason)
    return_logprob = bool(body.get("return_logprob", False))
    if greedy and return_logprob:
        raise ValueError("return_logprob: not supported with temperature 0 (greedy)")
    stop_ids = sp.get("stop_token_ids") or []
    if not (isinstance(stop_ids, list) and all(isinstance(t, int) for t in stop_ids)):
        raise ValueError("sampling_params.stop_token_ids: must be a list of token ids")
    return SamplingRequest(
        input_ids=list(ids),
        gconfig=gconfig,
        greedy=greedy,
        stop_token_ids=list(stop_ids),
        return_logprob=return_logprob,
        rid=str(body.get("rid") or uuid.uuid4().hex),
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
        """Sample ``jobs`` (equal sampling) in one ``generate`` call; when it fails, each job
        alone, so only a job that fails alone gets an error."""
        with self._model_lock:
            try:
                answers = answer_each(self._sample, jobs, "rollout server")
            finally:
                self._n_in_batch = 0
        for job, answer in zip(jobs, answers):
            if isinstance(answer, Exception):
                logger.error("request %s failed: %s: %s", job.rid, type(answer).__name__, answer)
                job.future.set_exception(answer)
            else:
                job.future.set_result(answer)

    def _sample(self, jobs: list[SamplingRequest]) -> list[dict[str, Any]]:
        """The replies to ``jobs`` from one ``generate`` call (the model lock held)."""
        from transformers import StoppingCriteriaList

        self._n_in_batch = len(jobs)
        batch = self.engine.generate(
            [j.input_ids for j in jobs],
            jobs[0].gconfig,
            greedy=jobs[0].greedy,
            stop_token_ids=jobs[0].stop_token_ids,
            stopping_criteria=StoppingCriteriaList([StopWhenSet(self._interrupt)]),
        )
        version = self.engine.version
        g = jobs[0].gconfig
        finish = self.engine.finish_reasons(
            batch, g.max_new_tokens, jobs[0].stop_token_ids, g.stop, self._interrupt.is_set()
        )
        return [self._response(job, batch, i, version, finish[i]) for i, job in enumerate(jobs)]

    def _response(
        self,
        job: SamplingRequest,
        batch: dict[str, torch.Tensor],
        row: int,
        version: int,
        reason: str,
    ) -> dict[str, Any]:
        mask = batch["loss_mask"][row]
        out_ids = [int(t) for t in batch["input_ids"][row][mask].tolist()]
        stops = set(self.engine.eos_ids) | set(job.stop_token_ids)
        finish: dict[str, Any] = {"type": reason}
        if reason == "stop":  # the stop token, or None for a stop string
            finish["matched"] = out_ids[-1] if out_ids and out_ids[-1] in stops else None
        elif reason == "length":
            finish["length"] = len(out_ids)
        else:
            finish["message"] = "paused for a weight update"
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


@dataclass(frozen=True)
class ServerLimits:
    """Who may drive the server and what it accepts.

    Args:
        api_key: the key every request but ``/health`` must carry (None: none needed).
        weights_root: ``/update_weights_from_disk`` loads only paths below this folder
            (symlinks resolved; None: any path the server can read).
        max_body_bytes: the largest request body.
        requests: token ids and context every ``/generate`` must fit
            (:class:`~areal_m2po.rollout.engines.request_limits.RequestLimits`).
    """

    api_key: str | None = None
    weights_root: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    requests: RequestLimits = field(default_factory=RequestLimits)


class _BadBody(ValueError):
    """A request body that is not the JSON object an endpoint takes."""


async def _json_object(request: Request, empty_ok: bool = False) -> dict[str, Any]:
    raw = await request.body()
    if not raw and empty_ok:
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _BadBody(f"the request body is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _BadBody(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


async def _update_weights(worker: GenerationWorker, body: dict[str, Any], root: str | None) -> Any:
    """``/update_weights_from_disk``: 403 for a path outside ``root``, 400 for a load that
    fails (SGLang's reply shape either way)."""
    path = body.get("model_path")
    raw = body.get("weight_version")
    status = 400
    try:
        if not path or not isinstance(path, str):
            raise ValueError("model_path: required")
        if root is not None and not below_root(path, root):
            status = 403
            raise ValueError(f"model_path: {path} is not below the server's --weights-root")
        version = int(raw) if raw is not None else None
        cut = await asyncio.to_thread(
            worker.update_from_disk, path, version, bool(body.get("abort_all_requests"))
        )
    except (ValueError, OSError, RuntimeError) as exc:
        msg = " ".join(str(exc).split())
        return JSONResponse(
            {"success": False, "message": msg, "num_paused_requests": 0}, status_code=status
        )
    return {
        "success": True,
        "message": f"loaded weight version {worker.version}",
        "num_paused_requests": cut,
    }


def build_app(
    worker: GenerationWorker,
    model_path: str,
    tokenizer_path: str,
    limits: ServerLimits | None = None,
) -> Any:
    """The FastAPI application serving ``worker``, behind the key and body-size gate
    (:class:`~.guard.ServerGuard`) of ``limits``."""
    limits = limits or ServerLimits()
    app = FastAPI(title="areal_m2po rollout server", docs_url=None, redoc_url=None)
    app.add_middleware(ServerGuard, api_key=limits.api_key, max_body_bytes=limits.max_body_bytes)

    @app.exception_handler(_BadBody)
    async def bad_body(request: Request, exc: _BadBody) -> Any:
        return _error(str(exc))

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
            job = parse_generate_request(await _json_object(request), limits.requests)
        except ValueError as exc:
            return _error(str(exc))
        try:
            return await asyncio.wrap_future(worker.submit(job))
        except Exception as exc:
            return _error(f"generation failed: {exc}", 500)

    @app.post("/update_weights_from_disk")
    async def update_weights(request: Request) -> Any:
        return await _update_weights(worker, await _json_object(request), limits.weights_root)

    @app.post("/pause_generation")
    async def pause(request: Request) -> Any:
        body = await _json_object(request, empty_ok=True)
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
