"""``rollout.mode=async``: episodes run while the trainer trains, bounded by AReaL's rule.

A background thread runs an asyncio loop that starts the episode of a record (one group of
``n`` samples) only when :class:`~areal_m2po.rollout.staleness.StalenessBudget` allows it (at
most ``max_head_offpolicyness`` versions stale when trained on; at most
``max_concurrent_rollouts`` samples in flight, a group counting ``n``), and keeps each finished
group until the trainer asks for it. The trainer (main thread) calls
:meth:`AsyncRolloutExecutor.next_batch` for the next ``B`` groups in start order (a group the
workflow dropped leaves its batch smaller) and, after each update,
:meth:`AsyncRolloutExecutor.update_weights`, which has the engine load the new weights and
lets more groups start.

Records are drawn from the trainer's loader only on the main thread (``B`` at a time:
``eta + 1`` batches at start, one per update), so the loader is never touched concurrently.
With several trainer processes, every process draws the same batches and generates its
contiguous share of them on the shared servers, under a budget for its share; rank 0 alone
drives the servers (weights, versions: :class:`~.engines.remote.base.RemoteInferenceEngine`).
On resume, generation restarts from the checkpoint's policy version; episodes that were in
flight when the checkpoint was written are lost (their prompts are skipped for that epoch).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import torch

from areal_m2po.api.workflow_api import TrajectoryGroup
from areal_m2po.rollout.executor import Policy, RolloutExecutor, RolloutSetup
from areal_m2po.rollout.staleness import StalenessBudget
from areal_m2po.utils.data import Batch

logger = logging.getLogger("areal_m2po.async_rollout")

__all__ = ["AsyncRolloutExecutor"]


class AsyncRolloutExecutor(RolloutExecutor):
    """Groups generated ahead of the trainer, never more than ``eta`` versions stale.

    Args:
        setup: the engine, workflow and batch layout (:class:`RolloutSetup`).
        budget: the staleness/concurrency rule of this process (``B`` groups of ``n`` samples
            per step: its share of the batch).
        prompt_source: main-thread callable returning ``(records, epoch)``, the whole batch's
            records (``B * world``) on every process per call.
        rank, world: this process and how many there are: each generates its contiguous
            share of every batch's records on the shared servers.
    """

    def __init__(
        self,
        setup: RolloutSetup,
        budget: StalenessBudget,
        prompt_source: Callable[[], tuple[list[dict[str, Any]], int]],
        rank: int = 0,
        world: int = 1,
    ) -> None:
        super().__init__(setup)
        self.budget = budget
        self.prompt_source = prompt_source
        self.rank, self.world = rank, world
        self.base_version = 0
        self._prompts: collections.deque[tuple[dict[str, Any], int]] = collections.deque()
        self._cond = threading.Condition()
        self._done: dict[int, tuple[TrajectoryGroup | None, int]] = {}
        self._error: BaseException | None = None
        self._next_train = 0  # next group index for the trainer (main thread)
        # loop-thread state
        self._started = 0
        self._running_samples = 0
        self._version_delta = 0
        # perf_counter intervals during which at least one episode was running
        self.busy_intervals: list[tuple[float, float]] = []
        self._busy_since: float | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- main thread --------------------------------------------------------------------------

    def start(self, policy: Policy, version: int) -> None:
        """Ready the engine, load the policy as ``version``, draw the first ``eta + 1``
        batches of records and start generating."""
        self.engine.initialize()
        self.engine.update_weights_from_tensors(policy(), version)
        self.base_version = version
        for _ in range(self.budget.max_head_offpolicyness + 1):
            self._add_prompts()
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run_loop, args=(ready,), name="async-rollout", daemon=True
        )
        self._thread.start()
        ready.wait()
        logger.info(
            "async rollout: max_head_offpolicyness %d, %d samples in flight at most",
            self.budget.max_head_offpolicyness,
            self.budget.max_concurrent_samples,
        )

    def _add_prompts(self) -> None:
        records, epoch = self.prompt_source()
        per = len(records) // self.world
        for r in records[self.rank * per : (self.rank + 1) * per]:
            self._prompts.append((r, epoch))
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        assert self._loop is not None, "start() first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def next_batch(self) -> tuple[Batch, dict[str, float]]:
        """The next ``B`` groups in start order (blocks until they are done)."""
        b = self.budget.groups_per_batch
        want = list(range(self._next_train, self._next_train + b))
        t0 = time.perf_counter()
        while True:
            with self._cond:
                if self._error is None and not all(i in self._done for i in want):
                    self._cond.wait(timeout=0.2)
                if self._error is not None:
                    raise self._error
                if all(i in self._done for i in want):
                    done = [self._done.pop(i) for i in want]
                    break
            # outside the condition the loop thread needs (the engine may probe its servers)
            try:
                self.engine.check_health()
            except BaseException as exc:
                self._fail(exc)
        self._next_train += b
        batch, info = self._build([g for g, _ in done], max(e for _, e in done), 0.0)
        info["timing/gen_s"] = time.perf_counter() - t0  # the trainer's wait
        return batch, info

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, float]:
        """The engine loads the new weights; then more groups may start."""
        assert self._loop is not None, "start() first"
        t0 = time.perf_counter()
        if self._error is not None:
            raise self._error
        self.engine.update_weights_from_tensors(named_tensors, version)
        self._loop.call_soon_threadsafe(self._set_version_delta, version - self.base_version)
        self._add_prompts()
        return {"timing/server_sync_s": time.perf_counter() - t0}

    def close(self) -> None:
        try:
            if self._loop is not None and self._thread is not None and self._thread.is_alive():
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(30)
                self._thread.join(timeout=30)
        finally:
            super().close()  # the workflow, then the engine

    # -- loop thread --------------------------------------------------------------------------

    def _run_loop(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._loop = loop
        ready.set()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        producer = asyncio.create_task(self._produce())
        await self._stop.wait()
        for task in [producer, *self._tasks]:
            task.cancel()
        await asyncio.gather(producer, *self._tasks, return_exceptions=True)

    async def _shutdown(self) -> None:
        self._stop.set()

    def _set_version_delta(self, delta: int) -> None:
        self._version_delta = delta
        self._wake.set()

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    async def _produce(self) -> None:
        n = self.budget.samples_per_group
        while True:
            self._wake.clear()
            room = self.budget.can_start(self._started, self._running_samples, self._version_delta)
            while room > 0 and self._prompts and self._error is None:
                record, epoch = self._prompts.popleft()
                index = self._started
                self._started += 1
                self._running_samples += n
                if self._busy_since is None:
                    self._busy_since = time.perf_counter()
                task = asyncio.create_task(self._run_group(index, record, epoch))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                room -= 1
            await self._wake.wait()

    async def _run_group(self, index: int, record: dict[str, Any], epoch: int) -> None:
        try:
            group = await self._group(record)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._fail(exc)
            return
        finally:
            self._running_samples -= self.budget.samples_per_group
            if self._running_samples == 0 and self._busy_since is not None:
                self.busy_intervals.append((self._busy_since, time.perf_counter()))
                self._busy_since = None
            self._wake.set()
        with self._cond:
            self._done[index] = (group, epoch)
            self._cond.notify_all()
