"""The errors that stop a run after it started, each explained in one line.

The entry points (:func:`areal_m2po.entry.config_main`) print a :class:`RunError` as one
``error:`` line and exit with status 1, whichever trainer raised it; a bad config or bad input
found before training is a :class:`~areal_m2po.api.cli_args.ConfigError` (status 2).
"""

from __future__ import annotations

__all__ = ["NonFiniteTrainingError", "NonFiniteWeightsError", "RunError"]


class RunError(RuntimeError):
    """A run stopped for a reason its message states in one line (exit status 1)."""


class NonFiniteTrainingError(RunError):
    """Too many consecutive training steps were skipped for a non-finite loss or gradient."""


class NonFiniteWeightsError(RunError):
    """A save was refused: the model's weights hold NaN or infinity."""
