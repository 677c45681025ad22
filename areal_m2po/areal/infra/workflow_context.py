"""AReaL's ``workflow_context`` (``areal.infra.workflow_context`` at areal-project/AReaL
cbff54d6): what an episode may ask about itself while it runs: :func:`get` gives its
:class:`WorkflowContext`, :func:`stat_scope` the stats scope AReaL logs it under
(``rollout`` or ``eval-rollout``). The episode runner
(:mod:`areal_m2po.areal.trainer.episodes`) sets it for each episode it starts; it is a
:class:`contextvars.ContextVar`, so concurrent episodes each see their own.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

__all__ = ["WorkflowContext", "get", "set", "stat_scope"]


@dataclass(frozen=True)
class WorkflowContext:
    """``is_eval``: an evaluation episode; ``task_id``: the record's index in its batch;
    ``sample_idx``: which of the record's ``n_samples`` episodes this is;
    ``max_episode_tokens``: the trainer's episode budget (``rollout.max_episode_tokens``
    resolved; not AReaL's: an episode's sequence may hold no more tokens), None outside the
    trainer."""

    is_eval: bool = False
    task_id: int = 0
    sample_idx: int = 0
    max_episode_tokens: int | None = None


_CURRENT: contextvars.ContextVar[WorkflowContext | None] = contextvars.ContextVar(
    "areal_workflow_context", default=None
)


def get() -> WorkflowContext:
    """The running episode's context (defaults outside an episode)."""
    return _CURRENT.get() or WorkflowContext()


def set(context: WorkflowContext) -> None:  # noqa: A001 - AReaL's name
    """Set the running episode's context (the episode runner does)."""
    _CURRENT.set(context)


def stat_scope() -> str:
    """``eval-rollout`` in an evaluation episode, ``rollout`` otherwise."""
    return "eval-rollout" if get().is_eval else "rollout"
