"""``rollout.mode=sync``: generate, then train, in this process, with exact staleness.

Each step generates one batch with the engine's current policy (version ``v_t``), appends it
to a queue and trains on the oldest queued batch, which the policy of step ``t - s`` generated
(``s = rollout.staleness``; :meth:`SyncRolloutExecutor.prefill_one` queues ``s`` batches of the
initial policy first). The queue is saved in recover checkpoints. Before each batch, torch's
global RNG is seeded with ``seed * 1_000_003 + n_rollouts * 7919 + rank`` (the in-process
engine samples from it), so a run and its resumed copy sample the same tokens. Each rank runs
the episodes of its contiguous share of the batch's records, all at once on one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterable
from typing import Any

import torch

from areal_m2po.api.workflow_api import TrajectoryGroup
from areal_m2po.rollout.executor import Policy, RolloutExecutor, RolloutSetup
from areal_m2po.utils.aio import cancel_pending, gather_or_cancel
from areal_m2po.utils.data import Batch

__all__ = ["SyncRolloutExecutor"]


class SyncRolloutExecutor(RolloutExecutor):
    """The replay queue of ``rollout.staleness`` batches.

    Args:
        setup: the engine, workflow and batch layout (:class:`RolloutSetup`).
        loader: ``next_batch() -> (records, epoch)``, the batch's records on every rank.
        staleness: ``rollout.staleness``.
        seed: the run's seed.
        rank, world: this process and how many there are.
    """

    def __init__(
        self,
        setup: RolloutSetup,
        loader: Any,
        staleness: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        super().__init__(setup)
        self.loader = loader
        self.staleness = staleness
        self.seed = seed
        self.rank, self.world = rank, world
        self._loop = asyncio.new_event_loop()

    def start(self, policy: Policy, version: int) -> None:
        """The engine already holds the policy (or the checkpoint's behaviour policy)."""
        self.engine.initialize()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self._loop.run_until_complete(coro)

    def _local(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        per = len(records) // self.world
        return records[self.rank * per : (self.rank + 1) * per]

    async def _groups(self, records: list[dict[str, Any]]) -> list[TrajectoryGroup | None]:
        return await gather_or_cancel(*(self._group(r) for r in records))

    def generate_batch(self) -> tuple[Batch, dict[str, float]]:
        """One fresh batch from the engine's current policy (this rank's share)."""
        t0 = time.perf_counter()
        records, epoch = self.loader.next_batch()
        seed = self.seed * 1_000_003 + self.n_rollouts * 7919 + self.rank
        self.n_rollouts += 1
        torch.manual_seed(seed)
        groups = self.run(self._groups(self._local(records)))
        return self._build(groups, epoch, time.perf_counter() - t0)

    def prefill_needed(self) -> bool:
        return len(self.queue) < self.staleness

    def prefill_one(self) -> None:
        self.queue.append(self.generate_batch())

    def next_batch(self) -> tuple[Batch, dict[str, float]]:
        self.queue.append(self.generate_batch())
        return self.queue.popleft()

    def update_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> dict[str, float]:
        self.engine.update_weights_from_tensors(named_tensors, version)
        return {}

    def close(self) -> None:
        try:
            cancel_pending(self._loop)  # what a workflow's own fan-out may have left
            super().close()
        finally:
            self._loop.close()
