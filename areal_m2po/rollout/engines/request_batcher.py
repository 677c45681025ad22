"""Batching of concurrent ``agenerate`` calls for in-process engines (HF, vLLM).

The requests that arrive within one turn of the event loop (a batch's groups issue theirs at
once) are answered by one call of the engine's ``generate_jobs``, run in a worker thread so the
loop stays free; generation waits while the engine is paused.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from areal_m2po.api.engine_api import ModelRequest, ModelResponse

__all__ = ["Job", "RequestBatcher"]

Job = tuple[ModelRequest, "asyncio.Future[ModelResponse]", float]
"""A pending request, the future its caller awaits, and its submission time (perf_counter s)."""


class RequestBatcher:
    """Collects concurrent requests and answers them with one ``generate_jobs(jobs)`` call;
    holds the engine's pause state.

    Args:
        generate_jobs: responses to the jobs, in order (called in a worker thread).
        model_lock: the lock ``generate_jobs`` holds while it generates (:meth:`pause` waits
            for it).
    """

    def __init__(
        self, generate_jobs: Callable[[list[Job]], list[ModelResponse]], model_lock: threading.Lock
    ) -> None:
        self._generate_jobs = generate_jobs
        self._model_lock = model_lock
        self._running = threading.Event()  # cleared while paused; a batch waits for it
        self._running.set()
        self._pending: list[Job] = []
        self._flush_scheduled = False

    def pause(self) -> None:
        """Hold new batches back; returns once the running ``generate_jobs`` call has."""
        self._running.clear()
        with self._model_lock:
            pass

    def resume(self) -> None:
        """Let batches run again after :meth:`pause`."""
        self._running.set()

    async def submit(self, request: ModelRequest) -> ModelResponse:
        """The response to ``request``, generated together with the requests beside it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ModelResponse] = loop.create_future()
        self._pending.append((request, future, time.perf_counter()))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.create_task(self._flush_when_idle())
        return await future

    async def _flush_when_idle(self) -> None:
        seen = -1
        while seen != len(self._pending):  # one loop turn without a new request
            seen = len(self._pending)
            await asyncio.sleep(0)
        jobs, self._pending = self._pending, []
        self._flush_scheduled = False
        while not self._running.is_set():  # paused: wait for resume()
            await asyncio.sleep(0.01)
        try:
            answers = await asyncio.to_thread(self._generate_jobs, jobs)
        except BaseException as exc:
            for _, future, _ in jobs:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future, _), answer in zip(jobs, answers):
            if not future.done():
                future.set_result(answer)
