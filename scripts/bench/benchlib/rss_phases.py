"""Peak resident memory per trainer phase: a sampling thread plus the trainer's step callbacks.

:class:`RssSampler` reads this process's resident set (``/proc/self/statm``) every few
milliseconds in a daemon thread and keeps the largest value seen under the current phase
label. :class:`PhaseMarks` is a :class:`~areal_m2po.api.callbacks.StepCallback` that sets the
label from the trainer's phases (generate, prox, ref, advantages, update, sync);
:func:`mark` labels any other call (evaluation, checkpointing, the optimizer step) the same
way. Linux only (``/proc``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from areal_m2po.api.callbacks import StepCallback

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size in bytes (``/proc/self/statm``, second field)."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * _PAGE


class RssSampler:
    """Samples the resident set every ``interval_s`` seconds; the peak per phase label.

    ``peaks[label]`` is the largest resident set (bytes) seen while ``label`` was current;
    ``overall`` is the largest seen at all, ``overall_at`` the ``(step, label)`` it was seen
    under and ``by_step[step]`` the largest seen during each step (``step``: set by
    :class:`PhaseMarks`, 0 before the first; evaluation and checkpoints after a step count
    in it). The labels nest: :meth:`push` / :meth:`pop`.
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peaks: dict[str, int] = {}
        self.overall = 0
        self.overall_at: tuple[int, str] = (0, "other")
        self.step = 0
        self.by_step: dict[int, int] = {}
        self._stack: list[str] = ["other"]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        rss = rss_bytes()
        with self._lock:
            label = self._stack[-1]
            self.peaks[label] = max(self.peaks.get(label, 0), rss)
            self.by_step[self.step] = max(self.by_step.get(self.step, 0), rss)
            if rss > self.overall:
                self.overall, self.overall_at = rss, (self.step, label)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def push(self, label: str) -> None:
        self._sample()
        with self._lock:
            self._stack.append(label)
        self._sample()

    def pop(self) -> None:
        self._sample()
        with self._lock:
            if len(self._stack) > 1:
                self._stack.pop()
        self._sample()


class PhaseMarks(StepCallback):
    """Sets the sampler's label from the trainer's phases (``update`` nests ``m2po``)."""

    def __init__(self, sampler: RssSampler) -> None:
        self.sampler = sampler

    def on_step_begin(self, step: int) -> None:
        self.sampler.step = step

    def on_phase_begin(self, name: str) -> None:
        self.sampler.push(name)

    def on_phase_end(self, name: str, seconds: float) -> None:
        self.sampler.pop()


def mark(sampler: RssSampler, label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its calls labelled ``label`` in ``sampler`` (it still does what it did)."""

    def labelled(*args: Any, **kwargs: Any) -> Any:
        with labelled_as(sampler, label):
            return fn(*args, **kwargs)

    return labelled


@contextlib.contextmanager
def labelled_as(sampler: RssSampler, label: str) -> Iterator[None]:
    sampler.push(label)
    try:
        yield
    finally:
        sampler.pop()
