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
before it is queued (:mod:`.generate_request`): a body that is not a JSON object, token ids
outside the vocabulary, ``max_new_tokens`` or a prompt that does not fit the context, stop
strings the tokenizer cannot match, temperatures generation cannot sample at, and a body over
``--max-body-bytes`` each get a 4xx naming the limit (:mod:`~areal_m2po.rollout.common.guard`).
A request that still fails inside generation with an error of the request's kind (it fails
alone, the others of its batch are answered) is a 400 too: 5xx is for the server's own faults,
and carries one line, never a traceback. A weight load is all or nothing: the file opened
once and checked below the root, read whole from that descriptor (never mapped; a file that
changes or shrinks meanwhile is refused), every tensor checked against the served model, then
the swap and the version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from areal_m2po.rollout.common.guard import DEFAULT_MAX_BODY_BYTES, ServerGuard, below_root
from areal_m2po.rollout.common.weight_files import check_weights, parse_version, read_weights
from areal_m2po.rollout.engines.hf_generator import HFGenerator, StopWhenSet
from areal_m2po.rollout.engines.request_batcher import answer_each
from areal_m2po.rollout.engines.request_limits import RequestLimits
from areal_m2po.rollout.servers.generate_request import (
    SamplingRequest,
    check_min_new_tokens,
    check_stop_strings,
    checked_text,
    parse_generate_request,
    parse_json_object,
)

logger = logging.getLogger("areal_m2po.rollout_server")

__all__ = [
    "GenerationWorker",
    "RequestFault",
    "SamplingRequest",
    "ServerLimits",
    "build_app",
    "parse_generate_request",
]


class RequestFault(ValueError):
    """Generation failed on a request that failed alone with an error of the request's kind
    (ValueError, TypeError, IndexError, OverflowError): the server answers 400, not 500."""


_REQUEST_KINDS = (ValueError, TypeError, IndexError, OverflowError, KeyError)


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

    def update_from_disk(
        self, path: str, version: int | None, abort_all: bool, root: str | None = None
    ) -> int:
        """Load a weights directory written by ``weight_files.write_weights``, all or nothing;
        returns how many requests were cut short. The version is the request's, else the
        file's stamp. Every check (the file below ``root``, readable, the tensors' names,
        shapes, kinds and finiteness, the version) passes before the model changes, so a
        refused load leaves the old weights and version."""
        state, stamp = read_weights(path, root)
        if version is None:
            version = stamp
        if version is None:
            raise ValueError(f"weight_version: not given and {path} carries no stamp")
        if stamp is not None and stamp != version:
            raise ValueError(f"weight_version {version} != the version {stamp} stamped in {path}")
        model = self.engine.model
        check_weights(state, dict(model.state_dict()), path, _tied_names(model))
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
                if isinstance(answer, _REQUEST_KINDS):
                    answer = RequestFault(" ".join(str(answer).split())[:300])
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


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def _error(message: str, status: int = 400) -> Any:
    line = message if len(message) <= 500 else message[:500] + "..."
    return JSONResponse({"error": {"message": line}}, status_code=status)


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
    try:
        return parse_json_object(await request.body(), empty_ok)
    except ValueError as exc:
        raise _BadBody(str(exc)) from None


def _tied_names(model: Any) -> frozenset[str]:
    """The output-embedding names of a model whose head is tied to its input embedding (a
    weights file may leave them out)."""
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    if not tied or model.get_output_embeddings() is None:
        return frozenset()
    return frozenset(n for n in model.state_dict() if n.startswith("lm_head."))


async def _update_weights(worker: GenerationWorker, body: dict[str, Any], root: str | None) -> Any:
    """``/update_weights_from_disk``: 403 for a path (or a file in it) outside ``root``, 400
    for a load that fails or a malformed field (SGLang's reply shape either way)."""
    status = 400
    try:
        path = checked_text(body.get("model_path"), "model_path", 4096)
        if not path:
            raise ValueError("model_path: required")
        if root is not None and not below_root(path, root):
            status = 403
            raise ValueError(f"model_path: {path} is not below the server's --weights-root")
        raw = body.get("weight_version")
        version = parse_version(raw) if raw is not None else None
        cut = await asyncio.to_thread(
            worker.update_from_disk, path, version, bool(body.get("abort_all_requests")), root
        )
    except PermissionError as exc:
        return _load_refused(f"model_path: {exc}", 403)
    except (ValueError, OSError, RuntimeError) as exc:
        return _load_refused(" ".join(str(exc).split()), status)
    return {
        "success": True,
        "message": f"loaded weight version {worker.version}",
        "num_paused_requests": cut,
    }


def _load_refused(message: str, status: int) -> Any:
    return JSONResponse(
        {"success": False, "message": message[:500], "num_paused_requests": 0}, status_code=status
    )


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

    @app.exception_handler(Exception)
    async def server_fault(request: Request, exc: Exception) -> Any:
        logger.error("%s failed: %s", request.url.path, type(exc).__name__)
        return _error(f"{request.url.path} failed: {type(exc).__name__}", 500)

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
            vocab = limits.requests.vocab_size
            check_min_new_tokens(job, worker.engine.eos_ids, vocab)
            await asyncio.to_thread(check_stop_strings, worker.engine.tokenizer, job.gconfig.stop)
        except ValueError as exc:
            return _error(str(exc))
        try:
            return await asyncio.wrap_future(worker.submit(job))
        except RequestFault as exc:
            return _error(f"generation refused the request: {exc}")
        except Exception as exc:  # noqa: BLE001 - the server's fault: one line, no traceback
            return _error(f"generation failed: {type(exc).__name__}: {_line(exc)}", 500)

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
