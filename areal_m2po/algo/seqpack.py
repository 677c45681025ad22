"""Allocating sequences to micro-batches by length: first-fit decreasing and Karmarkar-Karp,
with the names, arguments and results of AReaL's ``areal/utils/seqpack.py``
(areal-project/AReaL cbff54d6).

Every allocator takes ``values`` (token counts, ints), a ``capacity`` (the most tokens one group
may hold), ``min_groups`` and ``n_groups_divisor`` (the group count is a multiple of it) and
returns groups of indices into ``values``.

* :func:`ffd_allocate`: values largest first; each goes to the group with the fewest items
  among those it fits in, or opens a new group (also while fewer than ``min_groups`` exist).
* :func:`kk_allocate`: ``k = max(min_groups, ceil(sum / capacity))`` groups (rounded up to the
  divisor, at most ``len(values)``), balanced by the largest differencing method: every value
  (or, with ``equal_size``, every run of ``k`` sorted values) starts as a k-way partial
  partition; the two with the largest spread (max minus min group sum) are merged, the
  largest group of one joined with the smallest of the other, until one remains. A result over
  capacity falls back to :func:`ffd_allocate`.

Pure Python: no torch, no numpy.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "PACKING_ALGORITHMS",
    "PACKING_ALGORITHM_FFD",
    "PACKING_ALGORITHM_KK",
    "ffd_allocate",
    "get_allocate_fn",
    "kk_allocate",
    "packing_metrics",
]

logger = logging.getLogger("areal_m2po.algo.seqpack")

PACKING_ALGORITHM_FFD = "ffd"
PACKING_ALGORITHM_KK = "kk"
PACKING_ALGORITHMS = {PACKING_ALGORITHM_FFD, PACKING_ALGORITHM_KK}

Allocator = Callable[..., list[list[int]]]


def get_allocate_fn(algorithm: str = PACKING_ALGORITHM_FFD) -> Allocator:
    """:func:`ffd_allocate` for ``"ffd"``, :func:`kk_allocate` for ``"kk"``.

    Raises:
        ValueError: any other name.
    """
    if algorithm == PACKING_ALGORITHM_FFD:
        return ffd_allocate
    if algorithm == PACKING_ALGORITHM_KK:
        return kk_allocate
    raise ValueError(
        f"Unknown packing algorithm '{algorithm}'. Supported algorithms: "
        f"{sorted(PACKING_ALGORITHMS)}"
    )


def _check(values: Sequence[int], capacity: int, min_groups: int) -> None:
    if any(v > capacity for v in values):
        raise RuntimeError(f"Values {list(values)} is larger than capacity {capacity}")
    if len(values) < min_groups:
        raise RuntimeError(
            f"Number of values {len(values)} is smaller than min_groups {min_groups}"
        )


def _first_fit_decreasing(values: Sequence[int], capacity: int, min_groups: int) -> list[list[int]]:
    """One first-fit-decreasing pass (see the module docstring)."""
    order = sorted(range(len(values)), key=lambda i: -values[i])  # stable: ties by index
    groups: list[list[int]] = []
    loads: list[tuple[float, int]] = []  # (group sum, group id), ascending
    for idx in order:
        v = values[idx]
        if len(loads) < min_groups or loads[0][0] + v > capacity:
            bisect.insort(loads, (float(v), len(groups)))
            groups.append([idx])
            continue
        n_fit = bisect.bisect_right(loads, (capacity - v, len(values)))
        pick = min(range(n_fit), key=lambda j: (len(groups[loads[j][1]]), j))
        load, gid = loads.pop(pick)
        bisect.insort(loads, (float(load + v), gid))
        groups[gid].append(idx)
    return groups


def ffd_allocate(
    values: list[int], capacity: int, min_groups: int, n_groups_divisor: int = 1
) -> list[list[int]]:
    """Groups of indices of ``values``, each summing to at most ``capacity``, at least
    ``min_groups`` of them and a multiple of ``n_groups_divisor`` (first-fit decreasing).

    Raises:
        RuntimeError: a value exceeds ``capacity``, or too few values for the group count.
    """
    if min_groups is None or min_groups < n_groups_divisor:
        min_groups = n_groups_divisor
    _check(values, capacity, min_groups)
    while True:
        groups = _first_fit_decreasing(values, capacity, min_groups)
        min_groups += n_groups_divisor - min_groups % n_groups_divisor
        if len(groups) % n_groups_divisor == 0:
            return groups
        if len(values) < min_groups:
            raise RuntimeError(
                f"Cannot allocate values {values} that satisfies capacity {capacity}, "
                f"min_groups {min_groups} and n_groups_divisor {n_groups_divisor}."
            )


class _KKSet:
    """One group of a partial partition: its ``(index, value)`` items and their sum."""

    __slots__ = ("items", "sum")

    def __init__(self) -> None:
        self.sum = 0
        self.items: list[tuple[int, int]] = []

    def add(self, idx: int, val: int) -> None:
        self.items.append((idx, val))
        self.sum += val

    def merge(self, other: _KKSet) -> None:
        for idx, val in other.items:
            self.add(idx, val)

    def _key(self) -> tuple[Any, ...]:
        return (self.sum, len(self.items), self.items)

    def __lt__(self, other: _KKSet) -> bool:
        return self._key() < other._key()


class _KKState:
    """A k-way partial partition, its groups largest first."""

    __slots__ = ("k", "sets")

    def __init__(self, items: list[tuple[int, int]], k: int) -> None:
        if len(items) not in (1, k):
            raise AssertionError(f"{len(items)} not in [1, {k}]")
        self.k = k
        self.sets = [_KKSet() for _ in range(k)]
        for group, (idx, val) in zip(self.sets, items):
            group.add(idx, val)
        self.sets.sort(reverse=True)

    def get_partitions(self) -> list[list[int]]:
        return [[idx for idx, _ in group.items] for group in self.sets]

    def merge(self, other: _KKState) -> None:
        """Join this state's i-th largest group with ``other``'s i-th smallest."""
        for i in range(self.k):
            self.sets[i].merge(other.sets[self.k - 1 - i])
        self.sets.sort(reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: _KKState) -> bool:
        """Larger spread first (a max-heap on ``heapq``), then the larger top group."""
        if self.spread != other.spread:
            return self.spread > other.spread
        return other.sets[0] < self.sets[0]


def _kk_partition(values: list[int], k: int, equal_size: bool = False) -> list[list[int]]:
    """``k`` groups of indices of ``values`` by the largest differencing method (with
    ``equal_size``, ``len(values) // k`` items each)."""
    ascending = sorted((val, idx) for idx, val in enumerate(values))
    if equal_size:
        if len(values) % k:
            raise AssertionError(f"{len(values)} % {k} != 0")
        runs = [ascending[i : i + k] for i in range(0, len(ascending), k)]
        heap = [_KKState([(idx, val) for val, idx in run], k) for run in runs]
    else:
        heap = [_KKState([(idx, val)], k) for val, idx in ascending]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    return heap[0].get_partitions()


def kk_allocate(
    values: list[int],
    capacity: int,
    min_groups: int,
    n_groups_divisor: int = 1,
    equal_size: bool = False,
) -> list[list[int]]:
    """Balanced groups of indices of ``values`` (Karmarkar-Karp; see the module docstring).

    Raises:
        RuntimeError: a value exceeds ``capacity``, too few values, or ``equal_size`` with a
            count not divisible by the group count.
    """
    if min_groups is None or min_groups < n_groups_divisor:
        min_groups = n_groups_divisor
    if any(v > capacity for v in values):
        raise RuntimeError(
            f"Some values exceed capacity {capacity}. "
            "Cannot pack a single item that is larger than the bin."
        )
    _check(values, capacity, min_groups)
    k = max(min_groups, math.ceil(sum(values) / capacity))
    if n_groups_divisor > 1:
        k = math.ceil(k / n_groups_divisor) * n_groups_divisor
    k = min(k, len(values))
    if equal_size and len(values) % k:
        raise RuntimeError(
            f"equal_size=True requires len(values) ({len(values)}) to be divisible by k ({k})"
        )
    groups = _kk_partition(values, k, equal_size=equal_size)
    worst = max(sum(values[i] for i in g) for g in groups)
    if worst > capacity:
        logger.warning("KK partition exceeds capacity (%d > %d); using FFD", worst, capacity)
        return ffd_allocate(values, capacity, min_groups, n_groups_divisor)
    return groups


def packing_metrics(
    values: Sequence[int], partitions: Sequence[Sequence[int]], capacity: int
) -> dict[str, Any]:
    """Balance of a partition: ``n_groups``, ``group_sums``, ``max_load``, ``min_load``,
    ``mean_load``, ``spread``, ``imbalance_ratio`` (spread / mean), ``std_dev`` (population),
    ``cv`` (std / mean), ``max_load_ratio`` (max / mean), ``utilization`` (mean / capacity),
    ``wasted_tokens`` (sum of capacity minus each group's load, at least 0); ratios are 0 when
    their denominator is."""
    sums = [sum(values[i] for i in group) for group in partitions]
    n = len(sums)
    if n == 0:
        return {
            "n_groups": 0,
            "group_sums": [],
            "max_load": 0,
            "min_load": 0,
            "mean_load": 0.0,
            "spread": 0,
            "imbalance_ratio": 0.0,
            "std_dev": 0.0,
            "cv": 0.0,
            "max_load_ratio": 0.0,
            "utilization": 0.0,
            "wasted_tokens": 0,
        }
    mean = sum(sums) / n
    std = (sum((s - mean) ** 2 for s in sums) / n) ** 0.5

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else 0.0

    return {
        "n_groups": n,
        "group_sums": sums,
        "max_load": max(sums),
        "min_load": min(sums),
        "mean_load": mean,
        "spread": max(sums) - min(sums),
        "imbalance_ratio": ratio(max(sums) - min(sums), mean),
        "std_dev": std,
        "cv": ratio(std, mean),
        "max_load_ratio": ratio(max(sums), mean),
        "utilization": ratio(mean, capacity),
        "wasted_tokens": sum(max(0, capacity - s) for s in sums),
    }
