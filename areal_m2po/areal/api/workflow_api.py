"""AReaL's workflow contract (``areal.api.workflow_api`` at areal-project/AReaL cbff54d6).

A :class:`RolloutWorkflow` runs one episode of a dataset record:
``await self.arun_episode(engine, data)`` calls ``await engine.agenerate(ModelRequest(...))``
(:class:`~areal_m2po.areal.api.engine_api.InferenceEngine`) and returns AReaL's dict of
tensors, each ``[k, T]`` (k rows, right-padded): ``input_ids``, ``loss_mask`` (1 on generated
tokens), ``logprobs`` (behaviour log-probs, nats, aligned to the token), ``versions`` (policy
version per token, -1 on the prompt), ``attention_mask`` and ``rewards`` (``[k]``); or None to
drop the sample. :mod:`areal_m2po.areal.trainer.episodes` turns the rows into this package's
trajectories (the trainer runs ``gconfig.n_samples`` episodes per record, as cbff54d6 does).

An agent in AReaL's other contract (any object with ``async def run(data, **extra_kwargs)``)
is run by this package's agent workflow (:mod:`areal_m2po.rollout.workflows.agent`).
"""

from __future__ import annotations

import abc
from typing import Any

__all__ = ["AgentWorkflow", "RolloutWorkflow", "WorkflowLike"]


class RolloutWorkflow(abc.ABC):
    """One episode of a record, as AReaL writes it (see the module doc)."""

    @abc.abstractmethod
    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        """The episode's tensor dict (rows ``[k, T]``), or None to drop it."""


class AgentWorkflow(abc.ABC):
    """AReaL's (deprecated) base of agents: a class with ``async def run(data,
    **extra_kwargs)`` returning a reward, or rewards keyed by completion id."""

    @abc.abstractmethod
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> Any:
        """Run the agent on ``data`` against ``extra_kwargs['base_url']``."""


WorkflowLike = Any
"""A :class:`RolloutWorkflow` (instance or class), a dotted path to one, or an agent."""
