"""Step callbacks, public API: the seam through which code outside the trainer watches a
training step (``RLTrainer(cfg, callbacks=[...])``). Owns :class:`StepCallback` (what a callback
implements), :class:`Phases` (how the trainer and the actor report phases) and :data:`PHASES`.

The trainer runs every step as named phases and reports them to its callbacks, in this order::

    on_step_begin(step)
      generate -> prox -> ref -> advantages -> update -> sync   (each: on_phase_begin/end)
    on_step_end(step, stats)

``teacher`` (the teacher's log-probs of on-policy distillation, with a ``teacher`` section)
runs between ``ref`` and ``advantages``.

``mismatch`` (the trainer's log-probs of the batch just generated, when
``rollout.logp_mismatch_freq`` is due) runs between ``generate`` and ``prox``.

``generate`` also runs before the first step when ``rollout.staleness`` queues batches ahead;
the actor reports ``m2po`` (the M2PO mask: once per PPO minibatch with ``m2_scope=global``, once
per micro-batch with ``microbatch``) nested inside ``update``. A callback that wants another
clock (e.g. process CPU time) reads it in ``on_phase_begin``/``on_phase_end``.
``scripts/bench`` times the trainer through this seam.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

__all__ = ["PHASES", "Phases", "StepCallback"]

PHASES = (
    "generate",
    "mismatch",
    "prox",
    "ref",
    "teacher",
    "advantages",
    "update",
    "sync",
    "m2po",
)
"""The phase names the trainer and the actor report."""


class StepCallback:
    """Base class of a step callback: override what you need; every hook does nothing here."""

    def on_step_begin(self, step: int) -> None:
        """Before training step ``step`` (1-based: the step about to run)."""

    def on_phase_begin(self, name: str) -> None:
        """Before phase ``name`` (one of :data:`PHASES`)."""

    def on_phase_end(self, name: str, seconds: float) -> None:
        """After phase ``name``; ``seconds``: its wall time (``time.perf_counter``)."""

    def on_step_end(self, step: int, stats: dict[str, float]) -> None:
        """After step ``step``, with the stats about to be logged (before evaluation)."""


class Phases:
    """Runs phases for an owner (trainer or actor) and tells the callbacks about them."""

    def __init__(self, callbacks: Sequence[StepCallback] = ()) -> None:
        self.callbacks = list(callbacks)

    @contextlib.contextmanager
    def __call__(self, name: str, stats: dict[str, float] | None = None) -> Iterator[None]:
        """Time the ``with`` body as phase ``name``; with ``stats``, add its wall seconds to
        ``stats["timing/<name>_s"]``."""
        for cb in self.callbacks:
            cb.on_phase_begin(name)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - t0
            if stats is not None:
                key = f"timing/{name}_s"
                stats[key] = stats.get(key, 0.0) + seconds
            for cb in self.callbacks:
                cb.on_phase_end(name, seconds)

    def step_begin(self, step: int) -> None:
        for cb in self.callbacks:
            cb.on_step_begin(step)

    def step_end(self, step: int, stats: dict[str, float]) -> None:
        for cb in self.callbacks:
            cb.on_step_end(step, stats)
