"""``rollout.workflow``: a built-in workflow name or a dotted path, built with its kwargs."""

from __future__ import annotations

import inspect
from typing import Any

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.api.workflow_api import RolloutWorkflow, WorkflowContext
from areal_m2po.utils.imports import load_object

__all__ = ["BUILTIN_WORKFLOWS", "build_workflow"]

BUILTIN_WORKFLOWS = {
    "rlvr": "areal_m2po.rollout.workflows.rlvr:RLVRWorkflow",
    "multi_turn": "areal_m2po.rollout.workflows.multi_turn.workflow:MultiTurnWorkflow",
    "agent": "areal_m2po.rollout.workflows.agent.workflow:AgentWorkflow",
}
"""Built-in workflow names and the classes they stand for."""


def build_workflow(
    spec: str, kwargs: dict[str, Any] | None, context: WorkflowContext
) -> RolloutWorkflow:
    """``factory(context, **kwargs)`` for the class or function ``spec`` names.

    Raises:
        ConfigError: one line naming ``rollout.workflow`` (it does not import, or builds no
            :class:`RolloutWorkflow`) or ``rollout.workflow_kwargs`` (the factory refuses them).
    """
    factory = load_object(BUILTIN_WORKFLOWS.get(spec, spec), "rollout.workflow")
    try:
        inspect.signature(factory).bind(context, **(kwargs or {}))
    except TypeError as exc:
        raise ConfigError("rollout.workflow_kwargs", f"{spec}: {exc}") from None
    except ValueError:  # no signature to check (a builtin): let the call say
        pass
    workflow = factory(context, **(kwargs or {}))
    if not isinstance(workflow, RolloutWorkflow):
        raise ConfigError(
            "rollout.workflow",
            f"{spec!r} built a {type(workflow).__name__}, not an "
            "areal_m2po.api.workflow_api.RolloutWorkflow",
        )
    return workflow
