"""The errors that stop a run after it started, each explained in one line.

The entry points (:func:`areal_m2po.entry.config_main`) print a :class:`RunError` as one
``error:`` line and exit with its :attr:`RunError.exit_status` (1; 143 for a run stopped by
SIGTERM), whichever trainer raised it; a bad config or bad input found before training is a
:class:`~areal_m2po.api.cli_args.ConfigError` (status 2).
"""

from __future__ import annotations

__all__ = [
    "NonFiniteTrainingError",
    "NonFiniteWeightsError",
    "RunError",
    "RunStopped",
    "WorkflowError",
]


class RunError(RuntimeError):
    """A run stopped for a reason its message states in one line (exit status 1)."""

    exit_status = 1


class NonFiniteTrainingError(RunError):
    """Too many consecutive training steps were skipped for a non-finite loss or gradient."""


class NonFiniteWeightsError(RunError):
    """A save was refused: the model's weights hold NaN or infinity."""


class RunStopped(RunError):
    """The run stopped early on SIGTERM, after a recover checkpoint (exit status 143, the
    status of a process ended by SIGTERM: the run is not finished, so ``train && next`` does
    not go on, and a scheduler may requeue it)."""

    exit_status = 143


class WorkflowError(RunError):
    """A rollout workflow or agent broke its contract (it raised, returned something else than
    a trajectory, or left nothing to train on); the message names ``rollout.workflow`` and,
    for an exception, the file and line in the user's code where it was raised."""
