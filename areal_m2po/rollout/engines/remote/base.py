"""Inference on rollout servers over HTTP: the one engine every server protocol shares.

:class:`RemoteInferenceEngine` implements :class:`~areal_m2po.api.engine_api.InferenceEngine`
for a pool of servers of one protocol (a :class:`~.protocol.RemoteBackend`: SGLang's or
vLLM's). Its HTTP calls run on an asyncio loop in a thread of its own, over one client
(:class:`~.http_client.ServerClient`), so it serves workflows on any event loop and the
trainer's thread alike; the pool's state is touched on that loop only, so nothing is locked.

* **Routing by request id.** A request goes to the server its ``rid`` went to before (an
  episode that sends every turn under one id stays on one server, whose prefix cache holds its
  context), else to the next live server in turn.
* **Abort and continue.** A completion cut short by a pause or a weight update (finish
  ``abort``) is continued from the tokens it has, once generation is allowed again, so its
  per-token versions say which weights made which token.
* **Weights** go through disk: one safetensors directory per version
  (:mod:`areal_m2po.rollout.common.weight_files`), which every server loads between a pause
  and a resume; older versions are deleted.
* **Faults** (:mod:`.errors`): a server that fails (:class:`~.errors.ServerError`: no
  connection, a timeout, a 5xx, a malformed reply, its process gone) or does not answer
  :data:`PROBES_TO_DROP` consecutive ``/health`` probes (one every ``health_check_interval``
  seconds) is dead. With
  ``tolerate_server_failures`` its unfinished requests continue on the others; otherwise, or
  when none is left, every call raises the first failure. A 4xx answer
  (:class:`~.errors.RequestError`) marks nothing dead and is raised to the caller; a request
  that cannot fit the servers (``options.request_limits``) is refused before it is sent. A
  refused weight update stops the engine (the servers may now hold different weights).
* **Key.** Every call carries the servers' API key (``options.api_key``); with several
  trainer processes, rank 0's key (generated for the servers it started) is broadcast.
* **Several trainer processes** share the servers: each generates its share on them, and rank
  0 alone drives them (waits for them at start, writes and loads weights, labels versions,
  pauses); rank 0 broadcasts the servers' addresses, and the error it got, so every rank
  stops with the same line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse
from areal_m2po.rollout.common.weight_files import (
    check_weights_version,
    prune_weights,
    write_weights,
)
from areal_m2po.rollout.engines.remote.errors import RequestError, RolloutServerError, ServerError
from areal_m2po.rollout.engines.remote.http_client import HttpCall, ServerClient
from areal_m2po.rollout.engines.remote.protocol import DONE, RemoteBackend
from areal_m2po.rollout.engines.request_limits import RequestLimits
from areal_m2po.utils import dist
from areal_m2po.utils.aio import cancel_pending, gather_or_cancel

__all__ = ["RemoteEngineOptions", "RemoteInferenceEngine", "ServerPool"]

logger = logging.getLogger("areal_m2po.remote_engine")

_ROUTES_KEPT = 4096
"""Request ids whose server is remembered (least recently used forgotten first)."""
PROBES_TO_DROP = 3
"""Consecutive failed ``/health`` probes after which a server is dead (one slow answer under
load is not a dead server); a server whose process exited is dead at its first."""


@dataclass(frozen=True)
class RemoteEngineOptions:
    """Timeouts, fault handling and where weights go (the ``rollout.*`` keys of these names).

    Args:
        weights_root: directory of the per-version weight folders the servers load.
        setup_timeout: seconds for every server to answer ``/health`` at start.
        request_timeout: seconds one request may take.
        health_check_interval: seconds between ``/health`` probes of every server.
        health_check_timeout: a server not answering ``/health`` within this is dead.
        tolerate_server_failures: continue on the other servers when one dies.
        api_key: the servers' API key, sent with every call (None: none; never printed).
        request_limits: what a request must fit to be sent (the servers' vocabulary and
            context; default: nothing checked here, the servers refuse).
    """

    weights_root: str | None = None
    setup_timeout: float = 120.0
    request_timeout: float = 3600.0
    health_check_interval: float = 5.0
    health_check_timeout: float = 10.0
    tolerate_server_failures: bool = False
    api_key: str | None = field(default=None, repr=False)
    request_limits: RequestLimits = field(default_factory=RequestLimits)


class ServerPool(Protocol):
    """Server processes started for this run, as the engine uses them
    (:class:`areal_m2po.rollout.servers.processes.ServerProcesses`)."""

    addrs: list[str]

    def exit_reason(self, addr: str) -> str | None: ...

    def stop(self) -> None: ...


class RemoteInferenceEngine(InferenceEngine):
    """Generation on a pool of rollout servers (see the module doc).

    Args:
        backend: the servers' protocol.
        options: timeouts, fault handling, ``weights_root``.
        addrs: ``host:port`` of servers run elsewhere.
        processes: servers started for this run (rank 0; stopped by :meth:`destroy`).
        model_config: a ``transformers`` config saved next to the weights (SGLang loads it).
        rank, world: this trainer process and how many share the servers; ranks other than 0
            get the addresses from rank 0 at :meth:`initialize`.
        client_factory: builds the HTTP client on the engine's loop (default
            :class:`~.http_client.ServerClient`; tests inject one with its methods).
    """

    def __init__(
        self,
        backend: RemoteBackend,
        options: RemoteEngineOptions | None = None,
        addrs: list[str] | None = None,
        processes: ServerPool | None = None,
        model_config: Any = None,
        rank: int = 0,
        world: int = 1,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if rank == 0 and not addrs and processes is None:
            raise ValueError("rollout.server_addrs: no rollout server to talk to")
        self.backend = backend
        self.options = options or RemoteEngineOptions()
        self.processes = processes
        self.model_config = model_config
        self.rank, self.world = rank, world
        self._client_factory = client_factory
        self._addrs = list(addrs or (processes.addrs if processes is not None else []))
        self._version = 0
        self._alive: list[str] = []
        self._dead: dict[str, asyncio.Event] = {}
        self._routes: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._next = rank  # round robin, each rank from its own server
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._initialized = False
        self._destroyed = False

    @property
    def addrs(self) -> list[str]:
        return list(self._addrs)

    # -- lifecycle ----------------------------------------------------------------------------

    def initialize(self) -> None:
        """Start the engine's loop; rank 0 waits until every server answers ``/health`` and
        labels them with the version; every rank then starts its health monitor."""
        if self._initialized:
            return
        if self._thread is None:  # (a retry after a failed start reuses the loop)
            ready = threading.Event()
            self._thread = threading.Thread(
                target=self._run_loop, args=(ready,), name="remote-engine", daemon=True
            )
            self._thread.start()
            ready.wait()
        self._drive(lambda: self._call(self._setup()))
        if self.world > 1:
            addrs, key = dist.broadcast_object((self._addrs, self.options.api_key))
            self._addrs = list(addrs)
            self._call(self._use_key(key))
        self._call(self._open_pool())
        self._submit(self._monitor())
        self._initialized = True

    def destroy(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        try:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
                self._thread.join(timeout=30)
        finally:
            if self.processes is not None:
                self.processes.stop()

    def _run_loop(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._stop = asyncio.Event()
        self._running = asyncio.Event()  # cleared while paused or loading weights
        self._running.set()
        opts = self.options
        self._client = (
            self._client_factory()
            if self._client_factory is not None
            else ServerClient(
                opts.request_timeout, opts.health_check_timeout, self._exit_reason, opts.api_key
            )
        )
        self._loop = loop
        ready.set()
        try:
            loop.run_until_complete(self._stop.wait())
            cancel_pending(loop)
            loop.run_until_complete(self._client.aclose())
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        self._stop.set()

    def _exit_reason(self, addr: str) -> str | None:
        return self.processes.exit_reason(addr) if self.processes is not None else None

    async def _setup(self) -> None:
        await self._client.wait_healthy(self._addrs, self.options.setup_timeout)
        labels = self.backend.label_calls(self._version)
        await gather_or_cancel(*(self._send(a, labels) for a in self._addrs))

    async def _use_key(self, api_key: str | None) -> None:
        self._client.set_api_key(api_key)

    async def _open_pool(self) -> None:
        self._alive = list(self._addrs)
        self._dead = {a: asyncio.Event() for a in self._addrs}

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{type(self).__name__}: initialize() first")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the engine's loop from another thread; its result."""
        return self._submit(coro).result()

    def _drive(self, action: Callable[[], None]) -> None:
        """Run ``action()`` (work on the servers) on rank 0 only; with several ranks every
        rank waits for it and raises the error it raised there."""
        if self.world == 1:
            action()
            return
        error: BaseException | None = None
        if self.rank == 0:
            try:
                action()
            except Exception as exc:  # told to every rank, then raised here
                error = exc
        shared = dist.broadcast_object(_portable(error))
        if error is not None:
            raise error
        if shared is not None:
            raise shared

    # -- health -------------------------------------------------------------------------------

    def check_health(self) -> None:
        """Raise the failure that stopped the engine (no I/O: the monitor probes)."""
        if self._error is not None:
            raise self._error

    def metrics(self) -> dict[str, float]:
        return {"rollout/n_servers": float(len(self._alive))}

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _server_failed(self, exc: ServerError) -> None:
        """Mark ``exc.addr`` dead; raise unless failures are tolerated and a server is left."""
        if exc.addr in self._alive:
            self._alive.remove(exc.addr)
            self._dead[exc.addr].set()
            logger.warning("%s; %d rollout servers left", exc, len(self._alive))
        if not self.options.tolerate_server_failures or not self._alive:
            self._fail(exc)
            raise self._error  # type: ignore[misc]

    async def _monitor(self) -> None:
        timeout = self.options.health_check_timeout
        misses = dict.fromkeys(self._addrs, 0)
        while True:
            await asyncio.sleep(self.options.health_check_interval)
            for addr in list(self._alive):
                if await self._client.healthy(addr):
                    misses[addr] = 0
                    continue
                misses[addr] = misses.get(addr, 0) + 1
                reason = self._exit_reason(addr)
                if reason is None and misses[addr] < PROBES_TO_DROP:
                    continue
                why = reason or (
                    f"did not answer /health within {timeout:g}s, {misses[addr]} probes in a row"
                )
                try:
                    self._server_failed(ServerError(addr, why))
                except RolloutServerError:
                    return

    async def _on_server(self, addr: str, coro: Coroutine[Any, Any, Any]) -> Any:
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

    async def _send(self, addr: str, calls: Iterable[HttpCall]) -> None:
        for call in calls:
            await self._client.call(addr, call)

    # -- generation ---------------------------------------------------------------------------

    def _route(self, rid: str) -> str:
        """The server of request id ``rid``: where it went before, else the next live one."""
        if not self._alive:
            raise self._error or RuntimeError("no rollout server is left")
        addr = self._routes.get(rid)
        if addr is None or addr not in self._alive:
            addr = self._alive[self._next % len(self._alive)]
            self._next += 1
        self._routes[rid] = addr
        self._routes.move_to_end(rid)
        while len(self._routes) > _ROUTES_KEPT:
            self._routes.popitem(last=False)
        return addr

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.check_health()
        engine = f"{self.backend.kind} engine"
        self.options.request_limits.check(
            request.input_ids, request.sampling.max_new_tokens, engine
        )
        return await asyncio.wrap_future(self._submit(self._generate(request)))

    async def _generate(self, request: ModelRequest) -> ModelResponse:
        t0 = time.perf_counter()
        s = request.sampling
        ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = ""
        addr = self._route(request.rid)
        while finish not in DONE and len(ids) < s.max_new_tokens:
            await self._running.wait()  # paused, or weights loading: continue after
            call = self.backend.generate_call(list(request.input_ids) + ids, s, len(ids))
            try:
                body = await self._on_server(addr, self._client.call(addr, call))
                chunk = self.backend.parse_generate(body, addr, s, self._version)
            except ServerError as exc:
                self._server_failed(exc)
                addr = self._route(request.rid)  # tolerated: continue elsewhere
                continue
            ids += chunk.ids
            logprobs += chunk.logprobs
            versions += chunk.versions
            finish = chunk.finish
            if finish == "abort":
                await asyncio.sleep(0.05)
        if finish not in DONE:
            finish = "length"
        return ModelResponse.to_request(request, ids, logprobs, versions, finish, t0)

    # -- weights, versions, pause -------------------------------------------------------------

    def update_weights_from_tensors(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        """Write the tensors once as ``<weights_root>/v<version>``, have every server load
        them, delete older versions (rank 0; every rank consumes ``named_tensors``, which may
        be a sharded model's gather)."""
        root = self.options.weights_root
        if root is None:
            raise RuntimeError(f"{type(self).__name__}: no weights_root to stage weights in")
        self.initialize()  # a resume loads the checkpoint's weights before the executor starts
        pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        state: dict[str, Any] = {}
        if self.rank == 0:
            state = self.backend.weights_to_write(pairs)
        else:
            for _ in pairs:
                pass

        def write_and_load() -> None:
            path = write_weights(state, root, version, self.model_config)
            state.clear()
            self._call(self._load(path, version))
            prune_weights(root, version)

        self._reload_with(write_and_load, version)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self.initialize()

        def load() -> None:
            check_weights_version(path, version)
            self._call(self._load(os.path.abspath(path), version))

        self._reload_with(load, version)

    def _reload_with(self, action: Callable[[], None], version: int) -> None:
        """Run ``action()`` (rank 0) with generation held, then hold ``version``."""
        self.check_health()
        was_running = self._call(self._hold())
        try:
            self._drive(action)
            self._version = int(version)
        finally:
            if was_running:
                self._call(self._release())
        self.check_health()

    async def _hold(self) -> bool:
        was = self._running.is_set()
        self._running.clear()
        return was

    async def _release(self) -> None:
        self._running.set()

    async def _load(self, path: str, version: int) -> None:
        async def one(addr: str) -> None:
            try:
                await self._on_server(addr, self._load_one(addr, path, version))
            except ServerError as exc:
                self._server_failed(exc)

        results = await asyncio.gather(*(one(a) for a in list(self._alive)), return_exceptions=True)
        for r in results:
            if isinstance(r, RequestError):  # the engine stops: not one request's refusal
                self._fail(RolloutServerError(r.addr, f"{r.reason}; no more rollout"))
                raise r
            if isinstance(r, BaseException):
                self._fail(r)
                raise r

    async def _load_one(self, addr: str, path: str, version: int) -> None:
        """Pause ``addr``, load ``path`` as ``version``, resume it (also when loading fails)."""
        await self._client.call(addr, self.backend.pause_call())
        try:
            for call in self.backend.load_weight_calls(path, version):
                self.backend.check_load_reply(call, await self._client.call(addr, call), addr)
        except BaseException:
            with contextlib.suppress(RolloutServerError):
                await self._client.call(addr, self.backend.resume_call())
            raise
        await self._client.call(addr, self.backend.resume_call())

    def pause(self) -> None:
        """Pause every live server: running requests end with ``abort`` and are continued by
        their ``agenerate`` after :meth:`resume`; new requests wait."""
        self._call(self._hold())
        self._drive(lambda: self._call(self._each([self.backend.pause_call()])))

    def resume(self) -> None:
        self._drive(lambda: self._call(self._each([self.backend.resume_call()])))
        self._call(self._release())

    async def _each(self, calls: list[HttpCall]) -> None:
        """Make ``calls`` (in order) on every live server at once."""
        await gather_or_cancel(*(self._send(a, calls) for a in list(self._alive)))

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        """Hold ``version``; started servers are labelled with it (at start otherwise)."""
        self._version = int(version)
        if self._initialized:
            calls = self.backend.label_calls(self._version)
            self._drive(lambda: self._call(self._each(calls)))


def _portable(error: BaseException | None) -> BaseException | None:
    """``error`` if it survives pickling (to send to the other ranks), else a RuntimeError
    with its message."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - any pickling failure: send the message alone
        return RuntimeError(str(error))
    return error
