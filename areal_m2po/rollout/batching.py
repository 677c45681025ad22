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
    """Collects concurrent requests and answers them with one ``generate_jobs(jobs)`` call.

    Args:
        generate_jobs: responses to the jobs, in order (called in a worker thread).
        running: cleared while the engine is paused; a batch waits for it to be set.
    """

    def __init__(
        self, generate_jobs: Callable[[list[Job]], list[ModelResponse]], running: threading.Event
    ) -> None:
        self._generate_jobs = generate_jobs
        self._running = running
        self._pending: list[Job] = []
        self._flush_scheduled = False

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
