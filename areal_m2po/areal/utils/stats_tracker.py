"""AReaL's ``stats_tracker`` (``areal.utils.stats_tracker`` at areal-project/AReaL cbff54d6),
as a workflow uses it: ``stats_tracker.get(scope).scalar(name=value)`` (and the module-level
``scalar``), ``scope(name)`` and ``record_timing(name)``.

Values recorded during an episode go to the episode's :class:`Recorder` (the episode runner
of :mod:`areal_m2po.areal.trainer.episodes` installs one per episode) and reach the trainer's
log as ``areal/<scope>/<name>``, the mean over the batch's episodes; outside an episode they
are dropped. AReaL's tensor statistics (``denominator``/``stat``) and its distributed export
are this trainer's own logging (``stats_logger``), not here.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator

__all__ = ["Recorder", "StatsTracker", "get", "record_timing", "scalar", "scope"]


class Recorder:
    """The scalars of one episode: ``values[key]`` lists what was recorded under ``key``."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(float(value))


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar(
    "areal_stats_recorder", default=None
)


def use_recorder(recorder: Recorder | None) -> None:
    """Send this context's (the running episode's) values to ``recorder``."""
    _RECORDER.set(recorder)


class StatsTracker:
    """Records scalars under ``prefix`` (a scope name, ``/``-joined)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def scalar(self, **values: float) -> None:
        """Record each ``name=value`` (a number)."""
        recorder = _RECORDER.get()
        if recorder is None:
            return
        for name, value in values.items():
            recorder.add(self._key(name), float(value))

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[StatsTracker]:
        """A tracker whose keys sit under ``name`` as well."""
        yield StatsTracker(self._key(name))

    @contextlib.contextmanager
    def record_timing(self, name: str) -> Iterator[None]:
        """Record the seconds the block takes as ``timeperf/<name>``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            StatsTracker(self._key("timeperf")).scalar(**{name: time.perf_counter() - t0})


def get(name: str = "") -> StatsTracker:
    """The tracker of scope ``name``."""
    return StatsTracker(name)


def scalar(**values: float) -> None:
    """Record each ``name=value`` at the top scope."""
    StatsTracker().scalar(**values)


def scope(name: str) -> contextlib.AbstractContextManager[StatsTracker]:
    """A tracker under scope ``name``."""
    return StatsTracker().scope(name)


def record_timing(name: str) -> contextlib.AbstractContextManager[None]:
    """Time a block (``timeperf/<name>``)."""
    return StatsTracker().record_timing(name)
