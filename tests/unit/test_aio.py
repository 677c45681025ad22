"""utils/aio.gather_or_cancel: results in order; on a failure every other task is settled
(cancelled or finished, its exception retrieved) before the first failure is raised."""

from __future__ import annotations

import asyncio
import gc

from areal_m2po.utils.aio import gather_or_cancel


def _run(coro, handled):
    """Run ``coro`` on a fresh loop whose exception handler appends to ``handled``; close it
    and collect garbage, so a task destroyed pending or an unretrieved exception is reported."""
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda _loop, context: handled.append(context["message"]))
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
        gc.collect()


async def _after(turns: int, value=None, error: BaseException | None = None):
    for _ in range(turns):
        await asyncio.sleep(0)
    if error is not None:
        raise error
    return value


def test_results_in_order_of_the_awaitables():
    handled: list[str] = []
    out = _run(gather_or_cancel(_after(3, "a"), _after(0, "b"), _after(1, "c")), handled)
    assert out == ["a", "b", "c"] and handled == []
    assert _run(gather_or_cancel(), handled) == []


def test_a_failure_settles_every_other_task_before_it_is_raised():
    handled: list[str] = []
    forever = asyncio.Event()
    seen: dict[str, object] = {}

    async def main():
        tasks = [
            asyncio.ensure_future(_after(1, error=KeyError("first"))),
            asyncio.ensure_future(_after(10, error=ValueError("later"))),
            asyncio.ensure_future(forever.wait()),
            asyncio.ensure_future(_after(0, "done")),
        ]
        try:
            await gather_or_cancel(*tasks)
        except KeyError as exc:
            seen["raised"] = exc
        seen["states"] = [t.done() for t in tasks]
        seen["cancelled"] = [t.cancelled() for t in tasks]

    _run(main(), handled)
    assert str(seen["raised"]) == "'first'"
    assert seen["states"] == [True, True, True, True]  # nothing outlives the call
    assert seen["cancelled"] == [False, True, True, False]  # the later error never ran
    assert handled == []  # no "Task exception was never retrieved", no pending task destroyed
