"""The inference engine of rollout servers speaking SGLang's HTTP protocol (ours or SGLang's).

:class:`RemoteSGLangEngine` implements :class:`~areal_m2po.api.engine_api.InferenceEngine`
over :class:`~areal_m2po.engine.sglang_client.SGLangClient`. Its HTTP calls run on an asyncio
loop in a thread of its own, so it serves workflows on any event loop and the trainer's
thread alike. Each request goes to the next live server (round robin), except that requests
with a context seen recently go to the server that got it (the ``n`` requests of a group share
one server, and its prefix cache); a completion cut short
by a weight update (finish ``abort``) is continued from the tokens it has, so its per-token
versions say which weights made which token. New weights go through disk: one safetensors
directory per version (:mod:`areal_m2po.rollout.servers.weight_files`), which every server loads with
``/update_weights_from_disk`` after ``/pause_generation``; older versions are deleted.

Faults: a server whose request fails (connection refused, HTTP error, ``request_timeout``) or
that does not answer ``/health`` within ``health_check_timeout`` is dead. With
``tolerate_server_failures`` its unfinished requests continue on the remaining servers (from
the tokens they already have); otherwise, or when none is left, every call raises
:class:`RolloutServerError` naming the server (the first failure's message).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_m2po.engine.sglang_client import Sample, ServerError, SGLangClient
from areal_m2po.rollout.servers.weight_files import prune_weights, write_weights
from areal_m2po.utils.aio import cancel_pending, gather_or_cancel

logger = logging.getLogger("areal_m2po.remote_engine")

__all__ = ["RemoteEngineOptions", "RemoteSGLangEngine", "RolloutServerError", "sglang_params"]


_AFFINITY_SIZE = 4096  # contexts remembered for server affinity


class RolloutServerError(RuntimeError):
    """Asynchronous rollout cannot go on (a server died or hung)."""


def sglang_params(s: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` of ``s`` (``max_new_tokens`` is set per request)."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
    }
    if s.min_new_tokens:
        params["min_new_tokens"] = s.min_new_tokens
    if s.stop:
        params["stop"] = list(s.stop)
    if s.stop_token_ids:
        params["stop_token_ids"] = list(s.stop_token_ids)
    return params


@dataclass
class RemoteEngineOptions:
    """Timeouts and fault handling (the ``rollout.*`` config keys of the same names)."""

    request_timeout: float = 3600.0
    health_check_interval: float = 5.0
    health_check_timeout: float = 10.0
    tolerate_server_failures: bool = False
    setup_timeout: float = 120.0


class RemoteSGLangEngine(InferenceEngine):
    """Generation on rollout servers.

    Args:
        addrs: ``host:port`` of each server.
        options: timeouts and fault handling.
        weights_root: where :meth:`update_weights_from_tensors` writes ``v<version>/``.
        model_config: the policy's ``transformers`` config, saved next to the weights.
        servers: the server processes started for this run (checked while waiting for
            ``/health``, stopped by :meth:`destroy`), or None for servers run elsewhere.
        client_factory: builds the HTTP client on the engine's loop (tests inject fakes with
            the methods of :class:`SGLangClient`).
    """

    def __init__(
        self,
        addrs: list[str],
        options: RemoteEngineOptions | None = None,
        weights_root: str | None = None,
        model_config: Any = None,
        servers: Any = None,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if not addrs:
            raise ValueError("rollout.server_addrs: no rollout server to talk to")
        self.addrs = list(addrs)
        self.options = opts = options or RemoteEngineOptions()
        self.weights_root = weights_root
        self.model_config = model_config
        self.servers = servers
        self._client_factory = client_factory or (
            lambda: SGLangClient(opts.request_timeout, opts.health_check_timeout)
        )
        self._alive: list[str] = list(addrs)
        self._dead: dict[str, asyncio.Event] = {}
        self._rr = 0
        self._affinity: collections.OrderedDict[int, str] = collections.OrderedDict()
        self._version = 0
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._destroyed = False

    # -- lifecycle ----------------------------------------------------------------------------

    def initialize(self) -> None:
        """Start the engine's loop, wait until every server answers ``/health``, start the
        health monitor."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(ready,), name="remote-engine", daemon=True
        )
        self._thread.start()
        ready.wait()
        self._call(self._wait_healthy())
        self._submit(self._monitor())

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        try:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
                self._thread.join(timeout=30)
        finally:
            if self.servers is not None:
                self.servers.stop()

    def _run_loop(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._stop = asyncio.Event()
        self._client = self._client_factory()
        self._dead = {a: asyncio.Event() for a in self.addrs}
        self._loop = loop
        ready.set()
        try:
            loop.run_until_complete(self._stop.wait())
            cancel_pending(loop)
            loop.run_until_complete(self._client.aclose())
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        assert self._stop is not None
        self._stop.set()

    def _submit(self, coro: Any) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("RemoteSGLangEngine: initialize() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Any) -> Any:
        """Run ``coro`` on the engine's loop from another thread; its result."""
        try:
            return self._submit(coro).result()
        except ServerError as exc:
            raise RolloutServerError(str(exc)) from None

    # -- health -------------------------------------------------------------------------------

    def check_health(self) -> None:
        if self._error is not None:
            raise self._error

    def _check_processes(self) -> None:
        """Raise naming a server started here that exited (while waiting for ``/health``)."""
        if self.servers is not None:
            try:
                self.servers.check_alive()
            except RuntimeError as exc:
                raise RolloutServerError(str(exc)) from None

    def metrics(self) -> dict[str, float]:
        return {"rollout/n_servers": float(len(self._alive))}

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    async def _wait_healthy(self) -> None:
        timeout = self.options.setup_timeout
        deadline = time.monotonic() + timeout
        for addr in self.addrs:
            while not await self._client.health(addr):
                self._check_processes()
                if time.monotonic() > deadline:
                    raise RolloutServerError(
                        f"rollout server {addr} did not answer /health within {timeout:g}s "
                        "(rollout.setup_timeout)"
                    )
                await asyncio.sleep(0.5)

    def _server_failed(self, addr: str, reason: str) -> None:
        """Mark ``addr`` dead; raise unless failures are tolerated and a server is left."""
        if addr in self._alive:
            self._alive.remove(addr)
            self._dead[addr].set()
            logger.warning("%s; %d rollout servers left", reason, len(self._alive))
        if not self.options.tolerate_server_failures or not self._alive:
            self._fail(RolloutServerError(reason))
            raise self._error  # type: ignore[misc]

    async def _monitor(self) -> None:
        while True:
            await asyncio.sleep(self.options.health_check_interval)
            for addr in list(self._alive):
                if not await self._client.health(addr):
                    t = self.options.health_check_timeout
                    try:
                        self._server_failed(
                            addr, f"rollout server {addr} did not answer /health within {t:g}s"
                        )
                    except RolloutServerError:
                        return

    def _pick_server(self, context: list[int] | None = None) -> str:
        """The next live server (round robin); a context seen recently goes where it went
        (a GRPO group's ``n`` requests share one server and its prefix cache)."""
        if not self._alive:
            self._fail(RolloutServerError("no rollout server is left"))
            raise self._error  # type: ignore[misc]
        key = hash(tuple(context)) if context is not None else None
        addr = self._affinity.get(key) if key is not None else None
        if addr is None or addr not in self._alive:
            addr = self._alive[self._rr % len(self._alive)]
            self._rr += 1
        if key is not None:
            self._affinity[key] = addr
            self._affinity.move_to_end(key)
            while len(self._affinity) > _AFFINITY_SIZE:
                self._affinity.popitem(last=False)
        return addr

    async def _on_server(self, addr: str, coro: Any) -> Any:
        """Await ``coro`` unless ``addr`` is declared dead first (then ServerError)."""
        dead = self._dead[addr]
        if dead.is_set():
            coro.close()
            raise ServerError(addr, "declared dead")
        task = asyncio.ensure_future(coro)
        waiter = asyncio.ensure_future(dead.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            if not task.done():  # the server died, or we are being cancelled
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise ServerError(addr, "declared dead")
        return task.result()

    # -- generation ---------------------------------------------------------------------------

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.check_health()
        return await asyncio.wrap_future(self._submit(self._generate(request)))

    async def _generate(self, request: ModelRequest) -> ModelResponse:
        t0 = time.perf_counter()
        sample = Sample(prompt_ids=list(request.input_ids))
        params = sglang_params(request.sampling)
        max_new = request.sampling.max_new_tokens
        addr = self._pick_server(request.input_ids)
        while True:
            try:
                call = self._client.generate(addr, sample, params, max_new)
                sample = await self._on_server(addr, call)
                break
            except ServerError as exc:
                self._server_failed(exc.addr, str(exc))
                addr = self._pick_server()  # tolerated: continue elsewhere
        return ModelResponse.to_request(
            request, sample.output_ids, sample.logprobs, sample.versions, sample.finish, t0
        )

    # -- weights ------------------------------------------------------------------------------

    def update_weights_from_tensors(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        """Write the tensors once as ``<weights_root>/v<version>``, have every server load
        them, delete older versions."""
        if self.weights_root is None:
            raise RuntimeError("RemoteSGLangEngine: no weights_root to stage weights in")
        pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        path = write_weights(dict(pairs), self.weights_root, version, self.model_config)
        self.update_weights_from_disk(path, version)
        prune_weights(self.weights_root, version)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self.check_health()
        self._call(self._update(os.fspath(path), version))
        self.check_health()
        self._version = int(version)

    async def _update(self, path: str, version: int) -> None:
        async def one(addr: str) -> None:
            try:
                await self._on_server(addr, self._client.update_weights(addr, path, version))
            except ServerError as exc:
                self._server_failed(exc.addr, str(exc))

        results = await asyncio.gather(*(one(a) for a in list(self._alive)), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                self._fail(r)
                raise r

    def pause(self) -> None:
        """Pause every live server (running requests end with ``abort`` and are continued
        by their ``agenerate`` once the servers run again)."""
        self._call(self._each("pause"))

    def resume(self) -> None:
        self._call(self._each("resume"))

    async def _each(self, method: str) -> None:
        await gather_or_cancel(*(getattr(self._client, method)(a) for a in list(self._alive)))

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        self._version = int(version)
