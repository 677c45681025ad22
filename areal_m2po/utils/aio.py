"""Structured fan-out for rollout coroutines.

``asyncio.gather`` propagates the first exception and leaves the other awaitables running. On
an event loop that is driven step by step (``run_until_complete``, as the sync executor does)
the loop then stops with those tasks half done: the exceptions they raise later are never
retrieved, and asyncio logs each one with a traceback when the task is garbage collected
("Task exception was never retrieved"), after the trainer has printed its one-line error.
:func:`gather_or_cancel` settles every task before it raises; :func:`cancel_pending` settles
what is left on a loop before it is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["cancel_pending", "gather_or_cancel"]

T = TypeVar("T")


async def gather_or_cancel(*aws: Awaitable[T]) -> list[T]:
    """The results of ``aws`` in order, run concurrently as tasks.

    When one fails (or this call is cancelled), the others are cancelled and awaited, so every
    exception is retrieved and no task outlives the call; then the first failure is raised.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def cancel_pending(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel every unfinished task of ``loop`` (not running) and run it until they are done.

    The loop turns once even when no task is left: callbacks that retrieve finished tasks'
    exceptions may still be queued, and ``loop.close()`` would drop them.
    """
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()

    async def settle() -> None:
        await asyncio.gather(*tasks, return_exceptions=True)

    loop.run_until_complete(settle())
