"""Agent code as a rollout workflow, through the OpenAI-compatible endpoint.

Built in as ``rollout.workflow=agent``, with ``rollout.workflow_kwargs``:

- ``agent``: dotted path (``package.module:function``; from Python, the function itself) of
  ``async def agent(base_url: str, api_key: str, record: dict) -> float``. It talks to the
  policy with ``openai.AsyncOpenAI(base_url=base_url, api_key=api_key)`` (as many calls as it
  likes, its own tools) and returns the episode's reward.
- ``host`` / ``port``: where the endpoint listens (``127.0.0.1``, a free port).
- ``allow_non_loopback``: bind a non-loopback host and serve non-loopback peers (false).
- ``max_tokens_limit``: largest ``max_tokens`` a request may ask for (null:
  ``gconfig.max_new_tokens``, also the default when a request gives none).

Each episode of a record (the executor runs ``gconfig.n_samples`` of them at once) is one
session of the endpoint, whose calls reach the engine under the session's request id (one
server of a remote engine), and yields one trajectory: the chain of calls ending at its last
call, merged (each call's prompt extends the previous call's tokens when the agent sends back
the conversation with the reply it got, so the tokens are exactly those the engine saw). Calls
off that chain (an agent that restarted a conversation, or ran several in parallel) are not
trained on; the group's stats count them (``agent/untrained_calls``).

The session keeps to the episode budget (``rollout.max_episode_tokens``): a call gets what its
prompt leaves, and a call whose prompt leaves nothing is refused (400,
``context_length_exceeded``). An episode whose budget ran out ends with finish reason
``length`` and is trained on: with the agent's reward if it returns one, with reward 0 if it
raises after the refusal (``agent/budget_ended_episodes`` counts them). The session is closed
before its trajectory is read; a call still running then is cancelled and not recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from areal_m2po.api.engine_api import InferenceEngine, SamplingParams
from areal_m2po.api.errors import WorkflowError
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.rollout.episode_errors import one_line
from areal_m2po.rollout.openai.endpoint import AgentProxy, AgentSession
from areal_m2po.utils.imports import load_object

__all__ = ["AgentFn", "AgentWorkflow"]

logger = logging.getLogger("areal_m2po.agent")
AgentFn = Callable[[str, str, dict[str, Any]], Awaitable[float]]
_KEY = "rollout.workflow_kwargs"


class AgentWorkflow(RolloutWorkflow):
    """Runs a user's agent function against the endpoint (see the module doc).

    The trainer's held-out evaluation runs the agent once per record with greedy calls
    (:meth:`aevaluate`): ``eval/accuracy`` (reward > 0.5), ``eval/reward_mean``,
    ``eval/calls_mean``.

    Raises:
        ValueError: one line naming the ``rollout.workflow_kwargs`` key that is wrong.
    """

    eval_metrics = ("reward_mean", "calls_mean")

    def __init__(
        self,
        context: WorkflowContext,
        agent: str | AgentFn | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        allow_non_loopback: bool = False,
        max_tokens_limit: int | None = None,
    ) -> None:
        if agent is None:
            raise ValueError(f"{_KEY}.agent: required (package.module:function)")
        self.agent: AgentFn = agent if callable(agent) else load_object(agent, f"{_KEY}.agent")
        if not asyncio.iscoroutinefunction(self.agent):
            raise ValueError(f"{_KEY}.agent: {agent!r} must be an async function")
        if max_tokens_limit is not None and not (
            isinstance(max_tokens_limit, int) and max_tokens_limit >= 1
        ):
            raise ValueError(f"{_KEY}.max_tokens_limit: must be an integer >= 1 or null")
        self.context = context
        self.max_tokens_limit = max_tokens_limit or context.gconfig.max_new_tokens
        self.proxy = AgentProxy(
            context.tokenizer, list(context.eos_token_ids), host, port, allow_non_loopback
        )
        self.agent_name = getattr(self.agent, "__qualname__", repr(self.agent))

    async def _run_agent(
        self, engine: InferenceEngine, record: dict[str, Any], sampling: SamplingParams
    ) -> tuple[AgentSession, float]:
        """One session of the agent on ``record``, its calls sampled with ``sampling``."""
        g = self.context.gconfig
        session = self.proxy.open_session(
            engine,
            sampling,
            self.max_tokens_limit,
            g.temperature,
            g.top_p,
            self.context.max_episode_tokens,
        )
        try:
            reward = await self.agent(session.base_url, session.api_key, dict(record))
        except Exception as exc:
            if not session.budget_refused:
                logger.debug("agent %s raised", self.agent_name, exc_info=exc)
                raise WorkflowError(
                    f"agent {self.agent_name} failed on record "
                    f"{str(record.get('question'))[:60]!r}: {one_line(exc)}"
                ) from exc
            reward = 0.0  # it gave up when the episode's budget ran out: the episode is over
        finally:
            self.proxy.close_session(session)
        if (
            isinstance(reward, bool)
            or not isinstance(reward, (int, float))
            or not math.isfinite(reward)
        ):
            raise WorkflowError(
                f"agent {self.agent_name} returned {repr(reward)[:80]}, not a finite number"
            )
        return session, float(reward)

    async def aevaluate(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> dict[str, float] | None:
        """One agent episode of ``record`` with greedy calls: ``correct`` (the agent's reward
        exceeds 0.5), ``reward_mean`` (its reward) and ``calls_mean`` (the calls it made)."""
        greedy = dataclasses.replace(self.context.sampling, temperature=0.0)
        session, reward = await self._run_agent(engine, record, greedy)
        return {
            "correct": float(reward > 0.5),
            "reward_mean": reward,
            "calls_mean": float(len(session.calls)),
        }

    async def arun_episode(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> Trajectory | None:
        """One agent session on ``record``: the trajectory of its last call's chain; None (the
        group dropped) when the agent made no call or the engine aborted one."""
        session, reward = await self._run_agent(engine, record, self.context.sampling)
        if not session.calls:
            logger.warning("agent %s made no call in an episode; group dropped", self.agent_name)
            return None
        if any(call.finish_reason == "abort" for call in session.calls):
            return None
        trajectory = session.trajectory(float(reward))
        trajectory.info["untrained_calls"] = len(session.calls) - len(session.chain())
        trajectory.info["budget_ended"] = session.budget_refused
        return trajectory

    async def afinish_group(
        self, record: dict[str, Any], trajectories: list[Trajectory]
    ) -> TrajectoryGroup:
        """The group, with the counts of its episodes' calls."""
        stats = {
            "agent/episodes": float(len(trajectories)),
            "agent/calls": float(sum(t.info["calls"] for t in trajectories)),
            "agent/untrained_calls": float(sum(t.info["untrained_calls"] for t in trajectories)),
            "agent/budget_ended_episodes": float(sum(t.info["budget_ended"] for t in trajectories)),
        }
        return TrajectoryGroup(trajectories, stats)

    def close(self) -> None:
        """Stop the endpoint."""
        self.proxy.close()
