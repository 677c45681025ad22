"""Agent code as a rollout workflow, through the OpenAI-compatible endpoint.

Built in as ``rollout.workflow=agent``, with ``rollout.workflow_kwargs``:

- ``agent``: dotted path (``package.module:function``; from Python, the function itself) of
  ``async def agent(base_url: str, api_key: str, record: dict) -> float``. It talks to the
  policy with ``openai.AsyncOpenAI(base_url=base_url, api_key=api_key)`` (as many calls as it
  likes, its own tools) and returns the episode's reward.
  Or an agent in AReaL's contract (``module:Class`` with ``async def run(self, data,
  **extra_kwargs)``, getting ``base_url``, ``api_key``, ``http_client``, returning a float or
  rewards keyed by completion / response id): :mod:`.areal_agent`, with ``rollout.agent``
  (parsers, ``turn_discount``) from :attr:`WorkflowContext.agent_config`.
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
import concurrent.futures
import dataclasses
import logging
import math
import multiprocessing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from areal_m2po.api.config.agent import AgentConfig
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
from areal_m2po.rollout.workflows.agent.areal_agent import (
    DropCounter,
    InteractionRewardError,
    interaction_rewards,
    resolve_agent,
    run_in_subprocess,
)

__all__ = ["AgentFn", "AgentWorkflow"]

logger = logging.getLogger("areal_m2po.agent")
AgentFn = Callable[[str, str, dict[str, Any]], Awaitable[float]]
_KEY = "rollout.workflow_kwargs"


def _used_tool(session: AgentSession) -> bool:
    """Whether a reply of ``session`` carried a parsed tool call."""
    return any(call.reply.get("tool_calls") for call in session.calls)


class AgentWorkflow(RolloutWorkflow):
    """Runs a user's agent function against the endpoint (see the module doc).

    The trainer's held-out evaluation runs the agent once per record with greedy calls
    (:meth:`aevaluate`): ``eval/accuracy`` (reward > 0.5), ``eval/reward_mean``,
    ``eval/calls_mean``, ``eval/tool_use_fraction`` (episodes with a parsed tool call).

    Raises:
        ValueError: one line naming the ``rollout.workflow_kwargs`` key that is wrong.
    """

    eval_metrics = ("reward_mean", "calls_mean", "tool_use_fraction")

    def __init__(
        self,
        context: WorkflowContext,
        agent: str | AgentFn | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        allow_non_loopback: bool = False,
        max_tokens_limit: int | None = None,
    ) -> None:
        self.entry = resolve_agent(agent, f"{_KEY}.agent")
        self.agent = self.entry.fn
        self.agent_config: AgentConfig = context.agent_config or AgentConfig()
        self.dropped = DropCounter()
        if self.agent_config.mode == "subproc" and not self.entry.areal:
            raise ValueError(
                "rollout.agent.mode: subproc runs agents in AReaL's contract (run(data)); "
                f"{self.entry.name} takes (base_url, api_key, record): use mode inline"
            )
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if max_tokens_limit is not None and not (
            isinstance(max_tokens_limit, int) and max_tokens_limit >= 1
        ):
            raise ValueError(f"{_KEY}.max_tokens_limit: must be an integer >= 1 or null")
        self.context = context
        self.max_tokens_limit = max_tokens_limit or context.gconfig.max_new_tokens
        self.proxy = AgentProxy(
            context.tokenizer,
            list(context.eos_token_ids),
            host,
            port,
            allow_non_loopback,
            tool_parser=self.agent_config.tool_call_parser,
            reasoning=self.agent_config.reasoning_parser,
        )
        self.agent_name = self.entry.name

    async def _call(self, session: AgentSession, record: dict[str, Any]) -> Any:
        """The agent's return value on ``record``, by its contract (AReaL's or ours)."""
        if not self.entry.areal:
            return await self.agent(session.base_url, session.api_key, dict(record))
        if self.agent_config.mode == "subproc":
            if self._pool is None:  # spawned: a fork would copy the trainer's threads
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    self.agent_config.subproc_max_workers, multiprocessing.get_context("spawn")
                )
            env = {"OPENAI_BASE_URL": session.base_url, "OPENAI_API_KEY": session.api_key}
            return await asyncio.get_running_loop().run_in_executor(
                self._pool, run_in_subprocess, self.entry.target, dict(record), env
            )
        async with httpx.AsyncClient(timeout=None) as http_client:
            return await self.agent(
                dict(record),
                base_url=session.base_url,
                api_key=session.api_key,
                http_client=http_client,
            )

    async def _run_agent(
        self, engine: InferenceEngine, record: dict[str, Any], sampling: SamplingParams
    ) -> tuple[AgentSession, Any]:
        """One session of the agent on ``record``, its calls sampled with ``sampling``: the
        session and the agent's return value (an AReaL agent's, unchecked; None when it
        raised: the episode was dropped and counted)."""
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
            reward = await self._call(session, record)
        except Exception as exc:
            if self.entry.areal and not session.budget_refused:
                self.dropped.add(
                    f"agent {self.agent_name} raised on record "
                    f"{str(record.get('question'))[:60]!r}: {type(exc).__name__}: {exc}"
                )
                return session, None
            if not session.budget_refused:
                logger.debug("agent %s raised", self.agent_name, exc_info=exc)
                raise WorkflowError(
                    f"agent {self.agent_name} failed on record "
                    f"{str(record.get('question'))[:60]!r}: {one_line(exc)}"
                ) from exc
            reward = 0.0  # it gave up when the episode's budget ran out: the episode is over
        finally:
            self.proxy.close_session(session)
        if self.entry.areal:
            return session, reward
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
        exceeds 0.5), ``reward_mean`` (its reward), ``calls_mean`` (the calls it made) and
        ``tool_use_fraction`` (1.0 when a reply of the episode carried a tool call)."""
        greedy = dataclasses.replace(self.context.sampling, temperature=0.0)
        session, result = await self._run_agent(engine, record, greedy)
        rewards = self._rewards(session, result)
        reward = rewards[-1] if rewards else (0.0 if self.entry.areal else result)
        return {
            "correct": float(reward > 0.5),
            "reward_mean": reward,
            "calls_mean": float(len(session.calls)),
            "tool_use_fraction": float(_used_tool(session)),
        }

    async def arun_episode(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> Trajectory | None:
        """One agent session on ``record``: the trajectory of its last call's chain; None (the
        group dropped) when the agent made no call or the engine aborted one."""
        session, result = await self._run_agent(engine, record, self.context.sampling)
        if result is None:  # an AReaL agent that raised: dropped and counted
            return None
        if not session.calls:
            logger.warning("agent %s made no call in an episode; group dropped", self.agent_name)
            return None
        if any(call.finish_reason == "abort" for call in session.calls):
            return None
        rewards = self._rewards(session, result)
        if rewards is None:
            return None
        trajectory = session.trajectory(rewards[-1] if self.entry.areal else float(result))
        if self.entry.areal:  # concat: the chain ending at the last call takes its reward
            trajectory.info["interaction_rewards"] = rewards
        trajectory.info["untrained_calls"] = len(session.calls) - len(session.chain())
        trajectory.info["budget_ended"] = session.budget_refused
        trajectory.info["used_tool"] = _used_tool(session)
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
            "agent/tool_episodes": float(sum(t.info["used_tool"] for t in trajectories)),
        }
        return TrajectoryGroup(trajectories, stats)

    def _rewards(self, session: AgentSession, result: Any) -> list[float] | None:
        """Each call's reward from an AReaL agent's ``result`` (areal_agent module doc);
        None, the episode dropped and counted, when it names no call or is no reward; []
        for this package's contract."""
        if not self.entry.areal or result is None or not session.calls:
            return []
        try:
            return interaction_rewards(
                len(session.calls),
                session.interactions,
                result,
                float(self.agent_config.turn_discount),
            )
        except InteractionRewardError as exc:
            self.dropped.add(f"agent {self.agent_name}: {exc}")
            return None

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """``agent/dropped_episodes``: AReaL-contract episodes dropped since the last batch
        (the agent raised or returned a reward for no call)."""
        return {"agent/dropped_episodes": float(self.dropped.take())}

    def close(self) -> None:
        """Stop the endpoint (and the worker processes of ``mode: subproc``)."""
        if self._pool is not None:  # an agent still running (hung) is terminated
            processes = list(getattr(self._pool, "_processes", {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.join(timeout=5)
                if process.is_alive():
                    process.terminate()
                    process.join(timeout=5)
            self._pool = None
        self.proxy.close()
