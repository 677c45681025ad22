"""Batching of concurrent ``agenerate`` calls for in-process engines (HF, vLLM), with faults
kept to the request that caused them.

The requests that arrive within one turn of the event loop (a batch's groups issue theirs at
once) are answered by one call of the engine's ``generate_jobs``, run in a worker thread so the
loop stays free; generation waits while the engine is paused. ``generate_jobs`` answers each
job with a response or the exception of that job alone; :func:`answer_each` gives an engine
that: when a batched call fails, each of its items is run again on its own, so only the items
that fail alone fail.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from areal_m2po.api.engine_api import ModelRequest, ModelResponse

__all__ = ["Job", "RequestBatcher", "answer_each"]

logger = logging.getLogger("areal_m2po.rollout")

Job = tuple[ModelRequest, "asyncio.Future[ModelResponse]", float]
"""A pending request, the future its caller awaits, and its submission time (perf_counter s)."""

Item = TypeVar("Item")
Answer = TypeVar("Answer")


def answer_each(
    run: Callable[[list[Item]], list[Answer]], items: Sequence[Item], what: str
) -> list[Answer | Exception]:
    """``run(items)``, one answer per item in order; when that call raises, ``run([item])``
    for each item alone, so an item that fails alone gets its own exception and the others
    their answers. ``what`` names the engine in the warning logged for a failed batch."""
    items = list(items)
    try:
        return list(run(items))
    except Exception as exc:
        if len(items) == 1:
            return [exc]
        logger.warning(
            "%s: a batch of %d failed (%s: %s); running each request alone",
            what, len(items), type(exc).__name__, exc,
        )  # fmt: skip
    answers: list[Answer | Exception] = []
    for item in items:
        try:
            answers.extend(run([item]))
        except Exception as exc:
            answers.append(exc)
    return answers


class RequestBatcher:
    """Collects concurrent requests and answers them with one ``generate_jobs(jobs)`` call;
    holds the engine's pause state.

    Args:
        generate_jobs: for each job in order its response, or the exception that fails that
            job alone (called in a worker thread; an exception it raises fails every job).
        model_lock: the lock ``generate_jobs`` holds while it generates (:meth:`pause` waits
            for it).
    """

    def __init__(
        self,
        generate_jobs: Callable[[list[Job]], Sequence[ModelResponse | Exception]],
        model_lock: threading.Lock,
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
            if future.done():  # its caller was cancelled
                continue
            if isinstance(answer, Exception):
                future.set_exception(answer)
            else:
                future.set_result(answer)
