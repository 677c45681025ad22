"""AReaL's ``AsyncRewardWrapper`` (``areal.api.reward_api`` at areal-project/AReaL cbff54d6):
a plain reward function awaited from a workflow without blocking its event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["AsyncRewardWrapper"]

logger = logging.getLogger("areal_m2po.areal")


class AsyncRewardWrapper:
    """``await AsyncRewardWrapper(fn)(*args, **kwargs)``: ``fn`` run in a worker thread; 0.0
    (with a warning) when it runs past ``timeout_seconds``, as AReaL's wrapper gives.

    AReaL runs it in a process pool; here a thread (a reward function that holds the GIL for
    long slows generation down; this package's ``reward.path`` runs in processes)."""

    def __init__(
        self, reward_fn: Callable[..., Any], timeout_seconds: float = 15, max_workers: int = 4
    ) -> None:
        if not callable(reward_fn):
            raise TypeError(f"AsyncRewardWrapper: {reward_fn!r} is not callable")
        self.reward_fn = reward_fn
        self.timeout_seconds = timeout_seconds
        self.max_workers = max_workers

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(self.reward_fn, *args, **kwargs), self.timeout_seconds
            )
        except asyncio.TimeoutError:
            name = getattr(self.reward_fn, "__name__", repr(self.reward_fn))
            logger.warning("reward %s ran past %gs; scored 0", name, self.timeout_seconds)
            return 0.0
