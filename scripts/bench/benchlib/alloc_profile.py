"""What is alive at the allocation peak of a CPU call: torch's profiler with ``profile_memory``.

:func:`live_at_peak` runs ``fn`` under ``torch.profiler`` (CPU activity, ``profile_memory``),
replays the allocator events in time order (allocations and frees, matched by address) and
returns the peak of the bytes allocated above the level at entry, with those live bytes grouped
by the operator that allocated them (e.g. ``aten::mm`` for the linear layers' outputs kept
for the backward, ``aten::silu`` for the MLP activation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def _walk(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def live_at_peak(fn: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """``(peak bytes above entry, {op name: bytes it allocated still alive at the peak})``."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    events = sorted(
        (n for n in _walk(tree) if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns
    )
    live: dict[int, tuple[int, str]] = {}
    cur = peak = 0
    snapshot: dict[int, tuple[int, str]] = {}
    for ev in events:
        size = int(ev.extra_fields.alloc_size)
        ptr = int(ev.extra_fields.ptr)
        if size > 0:
            op = ev.parent.name if ev.parent is not None else "?"
            live[ptr] = (size, op)
            cur += size
            if cur > peak:
                peak = cur
                snapshot = dict(live)
        else:
            cur += size  # a free: negative size (of a block allocated before entry, too)
            live.pop(ptr, None)
    by_op: dict[str, int] = {}
    for size, op in snapshot.values():
        by_op[op] = by_op.get(op, 0) + size
    return peak, dict(sorted(by_op.items(), key=lambda kv: -kv[1]))
