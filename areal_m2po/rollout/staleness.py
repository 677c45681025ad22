"""AReaL's capacity rule for asynchronous rollout, as a pure function of a few counters.

Asynchronous rollout starts GRPO groups (``n`` samples of one prompt) while the trainer trains.
Groups are numbered ``k = 0, 1, 2, ...`` in the order they are started (counted from the policy
version ``v0`` the rollout began at) and handed to the trainer in that order, ``B`` whole groups
per step, so group ``k`` is trained at version ``v0 + k // B``. A group started while the
servers hold version ``v0 + d`` is therefore ``k // B - d`` versions old when it is trained on
(its tokens are at least version ``v0 + d``: versions only go up on a server). AReaL's rule
(``max_head_offpolicyness = eta``) lets a group start only if

    k < (eta + d + 1) * B,

which gives ``k // B - d <= eta`` for every group: the bound holds for every sample, not only
on average, however slow or fast individual servers are (``tests/test_staleness.py``).
Concurrency is bounded separately: at most ``max_concurrent`` samples in flight.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StalenessBudget"]


@dataclass(frozen=True)
class StalenessBudget:
    """How many more groups may start now.

    Args:
        groups_per_batch: ``B``, prompt groups the trainer consumes per step.
        samples_per_group: ``n``, samples (server requests) per group.
        max_head_offpolicyness: ``eta`` >= 0, versions a trained sample may lag the trainer.
        max_concurrent_samples: samples allowed in flight at once (>= ``n``).
    """

    groups_per_batch: int
    samples_per_group: int
    max_head_offpolicyness: int
    max_concurrent_samples: int

    def __post_init__(self) -> None:
        if self.groups_per_batch < 1 or self.samples_per_group < 1:
            raise ValueError("groups_per_batch and samples_per_group must be >= 1")
        if self.max_head_offpolicyness < 0:
            raise ValueError(
                f"max_head_offpolicyness must be >= 0, got {self.max_head_offpolicyness}"
            )
        if self.max_concurrent_samples < self.samples_per_group:
            raise ValueError(
                f"max_concurrent_rollouts ({self.max_concurrent_samples}) must be at least "
                f"one group ({self.samples_per_group} samples)"
            )

    def groups_allowed(self, version_delta: int) -> int:
        """Groups that may have been started in total while the servers hold ``v0 + delta``."""
        return (self.max_head_offpolicyness + version_delta + 1) * self.groups_per_batch

    def can_start(self, started_groups: int, running_samples: int, version_delta: int) -> int:
        """Groups that may start now (>= 0).

        Args:
            started_groups: groups started so far (since ``v0``), finished or not.
            running_samples: samples whose generation has not finished yet.
            version_delta: the policy version every server holds, minus ``v0``.
        """
        by_staleness = self.groups_allowed(version_delta) - started_groups
        by_concurrency = (self.max_concurrent_samples - running_samples) // self.samples_per_group
        return max(0, min(by_staleness, by_concurrency))

    def train_delta(self, group_index: int) -> int:
        """The version (minus ``v0``) group ``group_index`` is trained at."""
        return group_index // self.groups_per_batch
