"""vLLM servers as the rollout engine: :class:`VLLMServerEngine` over HTTP with httpx.

Generation: vLLM's token-in/token-out endpoint ``/inference/v1/generate`` (``token_ids`` in;
sampled ``token_ids``, each token's processed log-prob, i.e. ``log softmax(logits /
temperature)``, and the weight-version spans of the output out). All ``n`` requests of one
context go to one server (its prefix cache shares their prefill). A request cut short by a
weight update (``finish_reason`` ``abort``) is continued from the tokens it has, so its tokens
may carry two versions; vLLM labels each token with the version set by
``/update_weight_version``, so the per-token versions are the server's own record.

Weight updates (:meth:`VLLMServerEngine.update_weights_from_disk`), on every server at once:
``/pause?mode=abort``, ``/collective_rpc`` of the worker extension's ``areal_reload_weights``
(:mod:`.vllm_worker_ext`, the tied head included), ``/reset_prefix_cache``,
``/update_weight_version``, ``/resume``. The servers are the trainer's
(:class:`~areal_m2po.rollout.vllm_servers.VLLMServerProcesses`) or addresses the user gives
(started with the same arguments, :func:`~areal_m2po.rollout.vllm_servers.server_command`).

Faults: a failed request, a server that exited or that does not answer ``/health`` raise
:class:`~areal_m2po.rollout.remote_engine.RolloutServerError`, one line naming the server
(``rollout server <addr>: ...``), which the trainer reports with the last good checkpoint.

Several trainer processes (DDP or FSDP2, ``world > 1``) share the servers: each generates its
share of the batch on them, and rank 0 alone drives them (starts them, writes the weights,
reloads, labels, pauses). Every rank calls :meth:`~VLLMServerEngine.initialize` and the weight,
version and pause calls together (each rank consumes the weight iterator, which may be a
sharded model's gather); rank 0 then broadcasts the servers' addresses, or the one-line error
it got, so every rank waits for the servers and stops with the same line.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import torch

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse
from areal_m2po.api.engine_api import SamplingParams as RequestSampling
from areal_m2po.rollout.engines.vllm.in_process import eos_ids_of
from areal_m2po.rollout.engines.vllm.setup import cuda_available
from areal_m2po.rollout.engines.vllm.weights import VersionOnlyState, with_tied_head
from areal_m2po.rollout.remote_engine import RolloutServerError
from areal_m2po.rollout.servers.weight_files import prune_weights, read_weights_of, write_weights
from areal_m2po.rollout.vllm_servers import VLLMServerOptions, VLLMServerProcesses
from areal_m2po.utils import dist
from areal_m2po.utils.aio import gather_or_cancel

__all__ = ["VLLMServerEngine", "VLLMServerEngineOptions", "sampling_payload", "span_versions"]


def _fault(addr: str, message: str) -> RolloutServerError:
    """The one-line fault of the server at ``addr``."""
    return RolloutServerError(f"rollout server {addr}: {message}")


@dataclass(frozen=True)
class VLLMServerEngineOptions:
    """Timeouts and where weights go (the ``rollout.*`` keys of the same names).

    Args:
        weights_root: directory of the per-version weight folders the servers load.
        setup_timeout: seconds for every server to answer ``/health`` at start.
        request_timeout: seconds one request may take.
        health_check_timeout: seconds one ``/health`` probe may take.
    """

    weights_root: str
    setup_timeout: float = 600.0
    request_timeout: float = 3600.0
    health_check_timeout: float = 10.0


def sampling_payload(s: RequestSampling, eos_ids: list[int], done: int) -> dict[str, Any]:
    """vLLM ``sampling_params`` (JSON) for the rest of ``s`` after ``done`` tokens."""
    if not s.greedy and (s.top_p < 1.0 or s.top_k > 0):
        raise ValueError(
            f"vLLM engine: top_p={s.top_p}, top_k={s.top_k}: its behaviour log-probs would be "
            "those of the truncated distribution, not log softmax(logits / temperature)"
        )
    params: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0 if s.greedy else s.temperature,
        "max_tokens": s.max_new_tokens - done,
        "min_tokens": max(0, s.min_new_tokens - done),
        "stop_token_ids": list(dict.fromkeys([*eos_ids, *s.stop_token_ids])),
        "detokenize": bool(s.stop),
    }
    if not s.greedy:
        params["logprobs"] = 0
    if s.stop:
        params["stop"] = list(s.stop)
    return params


def span_versions(spans: Any, n_tokens: int, default: int) -> list[int]:
    """Per-token versions from JSON weight-version spans (``default`` where unlabelled)."""
    versions = [default] * n_tokens
    for span in spans or ():
        label = str(span.get("version"))
        if label.lstrip("-").isdigit():
            start, end = int(span["start"]), int(span["end"])
            versions[start:end] = [int(label)] * (end - start)
    return versions


class VLLMServerEngine(VersionOnlyState, InferenceEngine):
    """Rollout on vLLM servers: started here (``servers``) or reached at ``addrs``.

    Args:
        tokenizer: the policy's tokenizer (EOS and padding ids).
        model_path: the policy's model directory (EOS ids of its generation config; whether
            its embeddings are tied).
        options: timeouts, where weights are written.
        addrs: ``host:port`` of running servers (None: start ``n_servers`` with ``servers``).
        servers: how to start the servers here.
        n_servers: servers to start.
        log_dir: their logs.
        rank, world: this trainer process and how many share the servers (rank 0 drives
            them).
    """

    def __init__(
        self,
        tokenizer: Any,
        model_path: str,
        options: VLLMServerEngineOptions,
        addrs: list[str] | None = None,
        servers: VLLMServerOptions | None = None,
        n_servers: int = 1,
        log_dir: str = "logs",
        rank: int = 0,
        world: int = 1,
    ) -> None:
        if not addrs and servers is None:
            raise ValueError("VLLMServerEngine: give addrs or servers")
        self.options = options
        self.model_path = model_path
        self.eos_ids = eos_ids_of(tokenizer, model_path)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self._addrs = list(addrs or [])
        self._launch = (servers, n_servers, log_dir) if not addrs else None
        self.processes: VLLMServerProcesses | None = None
        self._version = 0
        self._tied: bool | None = None
        self._running = threading.Event()
        self._running.set()
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._ready = False
        self.rank, self.world = rank, world

    @property
    def addrs(self) -> list[str]:
        return list(self._addrs)

    # -- lifecycle ----------------------------------------------------------------------------

    def initialize(self) -> None:
        """Start the servers (if asked), wait for ``/health``, label them with the version
        (rank 0; the other ranks get the addresses from it)."""
        if self._ready:
            return

        def start() -> None:
            if self._launch is not None and self.processes is None:
                servers, n, log_dir = self._launch
                assert servers is not None
                self.processes = VLLMServerProcesses(n, servers, log_dir, cuda_available())
                self._addrs = self.processes.addrs
            asyncio.run(self._setup())

        self._drive(start)
        if self.world > 1:
            self._addrs = list(dist.broadcast_object(self._addrs))
        self._ready = True

    def _drive(self, action: Any) -> None:
        """Run ``action()`` (work on the servers) on rank 0 only. With several ranks, every
        rank waits for it and raises the :class:`RolloutServerError` it raised there."""
        if self.world == 1:
            action()
            return
        error: BaseException | None = None
        if self.rank == 0:
            try:
                action()
            except Exception as exc:  # reported to every rank, then raised here
                error = exc
        message = dist.broadcast_object(None if error is None else str(error))
        if error is not None:
            raise error
        if message is not None:
            raise RolloutServerError(message)

    async def _setup(self) -> None:
        async with httpx.AsyncClient(timeout=self.options.request_timeout) as http:
            deadline = time.monotonic() + self.options.setup_timeout
            for addr in self._addrs:
                while not await self._healthy(http, addr):
                    self._raise_if_exited(addr)
                    if time.monotonic() > deadline:
                        raise _fault(
                            addr,
                            f"did not answer /health within {self.options.setup_timeout:g}s "
                            "(rollout.setup_timeout)",
                        )
                    await asyncio.sleep(0.5)
            await gather_or_cancel(*(self._label(http, a, self._version) for a in self._addrs))

    def destroy(self) -> None:
        self._ready = False
        if self.processes is not None:
            self.processes.stop()
            self.processes = None

    # -- HTTP ---------------------------------------------------------------------------------

    def _raise_if_exited(self, addr: str) -> None:
        reason = self.processes.exited(addr) if self.processes is not None else None
        if reason:
            raise _fault(addr, reason.replace(f"vLLM server {addr} ", "vLLM server "))

    async def _healthy(self, http: httpx.AsyncClient, addr: str) -> bool:
        try:
            resp = await http.get(
                f"http://{addr}/health", timeout=self.options.health_check_timeout
            )
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def _post(
        self, http: httpx.AsyncClient, addr: str, endpoint: str, payload: Any = None
    ) -> Any:
        try:
            resp = await http.post(f"http://{addr}{endpoint}", json=payload)
        except httpx.TimeoutException:
            raise _fault(
                addr, f"{endpoint} timed out after {self.options.request_timeout:g}s"
            ) from None
        except httpx.HTTPError as exc:
            self._raise_if_exited(addr)
            raise _fault(addr, f"{endpoint} failed: {type(exc).__name__}: {exc}") from None
        if resp.status_code != 200:
            first = resp.text.strip().splitlines()[0][:300] if resp.text.strip() else ""
            raise _fault(addr, f"{endpoint} returned {resp.status_code}: {first}")
        return resp.json() if resp.content else None

    def _client(self) -> httpx.AsyncClient:
        """One client per event loop (an httpx client belongs to the loop that made it)."""
        key = id(asyncio.get_running_loop())
        if key not in self._clients:
            self._clients[key] = httpx.AsyncClient(timeout=self.options.request_timeout)
        return self._clients[key]

    # -- generation ---------------------------------------------------------------------------

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        if not self._addrs:
            raise RuntimeError("vLLM server engine: initialize() first")
        t0 = time.perf_counter()
        addr = self._addrs[hash(tuple(request.input_ids)) % len(self._addrs)]
        http = self._client()
        s = request.sampling
        out: list[int] = []
        logps: list[float] = []
        versions: list[int] = []
        finish = "length"
        while len(out) < s.max_new_tokens:
            while not self._running.is_set():  # paused for a weight update
                await asyncio.sleep(0.02)
            payload = {
                "token_ids": list(request.input_ids) + out,
                "sampling_params": sampling_payload(s, self.eos_ids, len(out)),
                "stream": False,
            }
            body = await self._post(http, addr, "/inference/v1/generate", payload)
            try:
                choice = body["choices"][0]
                toks = [int(t) for t in choice["token_ids"]]
                content = (choice.get("logprobs") or {}).get("content") or []
                lps = [0.0] * len(toks) if s.greedy else [float(c["logprob"]) for c in content]
                finish = str(choice.get("finish_reason"))
            except (KeyError, IndexError, TypeError, ValueError):
                raise _fault(
                    addr, f"unexpected /inference/v1/generate reply: {str(body)[:300]}"
                ) from None
            if len(lps) != len(toks):
                raise _fault(addr, f"{len(toks)} tokens but {len(lps)} log-probs")
            out += toks
            logps += lps
            versions += span_versions(choice.get("weight_versions"), len(toks), self._version)
            if finish in ("stop", "length"):
                break
            if finish != "abort":
                raise _fault(addr, f"unexpected finish_reason {finish!r}")
            await asyncio.sleep(0.02)  # aborted by a weight update: continue when it is done
        if finish not in ("stop", "length"):
            finish = "length"
        return ModelResponse.to_request(request, out, logps, versions, finish, t0)

    # -- weights, versions, pause -------------------------------------------------------------

    async def _label(self, http: httpx.AsyncClient, addr: str, version: int) -> None:
        await self._post(http, addr, "/update_weight_version", {"new_version": str(version)})

    async def _reload(self, http: httpx.AsyncClient, addr: str, path: str, version: int) -> None:
        await self._post(http, addr, "/pause?mode=abort")
        try:
            rpc = {"method": "areal_reload_weights", "kwargs": {"path": path}}
            await self._post(http, addr, "/collective_rpc", rpc)
            await self._post(http, addr, "/reset_prefix_cache")
            await self._label(http, addr, version)
        finally:
            await self._post(http, addr, "/resume")

    def _run(self, coro_fn: Any, *args: Any) -> None:
        async def run() -> None:
            async with httpx.AsyncClient(timeout=self.options.request_timeout) as http:
                await gather_or_cancel(*(coro_fn(http, a, *args) for a in self._addrs))

        asyncio.run(run())

    def update_weights_from_disk(self, path: str, version: int) -> None:
        def reload() -> None:
            read_weights_of(path, version)  # refuse a directory stamped with another version
            self._run(self._reload, os.path.abspath(path), version)

        self._reload_with(reload, version)

    def update_weights_from_tensors(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        """Write the tensors once (``weights_root/v<version>``, the tied head included), have
        every server load them, delete older versions (rank 0; every rank consumes
        ``named_tensors``, which may be a sharded model's gather)."""
        pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        state: dict[str, torch.Tensor] = {}
        if self.rank == 0:
            state = dict(with_tied_head(pairs, self._is_tied()))
        else:
            for _ in pairs:
                pass

        def write_and_reload() -> None:
            path = write_weights(state, self.options.weights_root, version)
            state.clear()
            self._run(self._reload, path, version)
            prune_weights(self.options.weights_root, version)

        self._reload_with(write_and_reload, version)

    def _reload_with(self, reload: Any, version: int) -> None:
        """Run ``reload()`` (rank 0) with generation held, then hold ``version``."""
        self.initialize()  # a resume loads the checkpoint's weights before the executor starts
        was_running = self._running.is_set()
        self._running.clear()  # requests cut short wait here until every server has the weights
        try:
            self._drive(reload)
            self._version = int(version)
        finally:
            if was_running:
                self._running.set()

    def _is_tied(self) -> bool:
        if self._tied is None:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(self.model_path)
            self._tied = bool(getattr(cfg, "tie_word_embeddings", False))
        return self._tied

    def pause(self) -> None:
        self._running.clear()

        async def pause_one(http: httpx.AsyncClient, addr: str) -> None:
            await self._post(http, addr, "/pause?mode=abort")

        self._drive(lambda: self._run(pause_one))

    def resume(self) -> None:
        async def resume_one(http: httpx.AsyncClient, addr: str) -> None:
            await self._post(http, addr, "/resume")

        self._drive(lambda: self._run(resume_one))
        self._running.set()

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._drive(lambda: self._run(self._label, int(version)))
        self._version = int(version)

    def check_health(self) -> None:
        """Raise :class:`RolloutServerError` for the first server that exited or is not healthy."""

        async def probe(http: httpx.AsyncClient, addr: str) -> None:
            self._raise_if_exited(addr)
            if not await self._healthy(http, addr):
                self._raise_if_exited(addr)
                raise _fault(
                    addr, f"no answer to /health within {self.options.health_check_timeout:g}s"
                )

        self._run(probe)
