"""The errors that stop a run after it started, each explained in one line.

The entry points (:func:`areal_m2po.entry.config_main`) print a :class:`RunError` as one
``error:`` line and exit with its :attr:`RunError.exit_status` (1; 143 for a run stopped by
SIGTERM), whichever trainer raised it; a bad config or bad input found before training is a
:class:`ConfigError` (status 2), whether the config's own checks or the start-up checks found it.
This module imports nothing else of areal_m2po, so any layer can raise these.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "NonFiniteTrainingError",
    "NonFiniteWeightsError",
    "RunError",
    "RunStopped",
    "WorkflowError",
]


class ConfigError(ValueError):
    """A configuration value is invalid. ``key`` is the dotted name of the culprit field."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.detail = message
        super().__init__(f"{key}: {message}")

    def with_prefix(self, prefix: str) -> ConfigError:
        """The same error with the key qualified by its section, e.g. ``actor.eps_clip``."""
        return ConfigError(f"{prefix}.{self.key}" if prefix else self.key, self.detail)


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
