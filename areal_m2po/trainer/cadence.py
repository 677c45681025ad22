"""When a periodic action (evaluation, a Hugging Face save, a recover checkpoint) is due after a
training step: AReaL's three frequencies, any of which fires.

* ``freq_steps``: after every N-th step;
* ``freq_epochs``: after the last step of every N-th epoch (``step`` a multiple of N epochs'
  steps);
* ``freq_secs``: after the first step that ends N or more seconds after the action last ran (or
  after the cadence started).

:class:`Cadence` holds only the time of the last run; the trainer decides, runs the action and
calls :meth:`Cadence.ran`. Several processes must agree on a time-based decision: the trainer
reduces :meth:`Cadence.due_by_time` over ranks. Pure Python, no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["Cadence"]


class Cadence:
    """The cadence of one config section with ``freq_steps``, ``freq_epochs`` and
    ``freq_secs`` (each None or a positive number).

    Args:
        section: the config section (e.g. ``config.evaluator``).
        clock: seconds, monotonic (``time.monotonic``; tests pass a fake).
    """

    def __init__(self, section: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.freq_steps: int | None = getattr(section, "freq_steps", None)
        self.freq_epochs: int | None = getattr(section, "freq_epochs", None)
        self.freq_secs: float | None = getattr(section, "freq_secs", None)
        self._clock = clock
        self._last = clock()

    def due_by_count(self, step: int, steps_per_epoch: int) -> bool:
        """Due after ``step`` (finished steps, >= 1) by the step or epoch frequency."""
        if self.freq_steps and step % self.freq_steps == 0:
            return True
        if self.freq_epochs and steps_per_epoch > 0:
            return step % (self.freq_epochs * steps_per_epoch) == 0
        return False

    def due_by_time(self) -> bool:
        """Due by the time frequency: ``freq_secs`` or more since the last run."""
        return self.freq_secs is not None and self._clock() - self._last >= self.freq_secs

    def ran(self) -> None:
        """The action just ran: the time frequency counts from now."""
        self._last = self._clock()
