"""AReaL's agent contract, run as it is beside this package's ``agent(base_url, api_key, record)``.

An agent as AReaL writes it (``areal/experimental/openai/proxy/workflow.py`` at cbff54d6) is a
class with ``async def run(self, data, **extra_kwargs)`` (or such a function): it gets the
dataset record as ``data`` and ``base_url``, ``api_key``, ``http_client`` (an
``httpx.AsyncClient``) as keywords, runs any framework on them (the ``openai`` client, the
OpenAI Agents SDK) and returns a float (the reward of its last interaction) or a dict of
rewards keyed by completion or response id (one per interaction it wants rewarded).

Rewards (``rollout.agent.turn_discount`` = g): interactions are ordered by creation; the last
gets its own reward (0 when it has none) and each earlier one ``own[i] + g * reward[i + 1]``
(AReaL's backward discount). With ``export_style: concat`` the episode's trajectory is the
chain ending at its last interaction and takes that interaction's reward; every interaction's
reward is kept in ``trajectory.info["interaction_rewards"]``.

Bad outcomes are contained: an agent that raises, returns something else than a finite number
or a dict of them, or keys a reward by an id the session never answered, is logged in one line
and its episode dropped (its group with it) and counted in ``agent/dropped_episodes``; an
agent that never returns is cancelled at ``rollout.episode_timeout_s`` by the executor (its
group dropped, ``rollout/n_episode_timeouts``).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from areal_m2po.utils.imports import load_object, split_spec

__all__ = [
    "AgentEntry",
    "DropCounter",
    "InteractionRewardError",
    "discounted_rewards",
    "interaction_rewards",
    "resolve_agent",
    "run_in_subprocess",
]

logger = logging.getLogger("areal_m2po.agent")
AGENTS_EXTRA = "pip install 'areal_m2po[agents]' (or bash scripts/install.sh --dev)"


class InteractionRewardError(ValueError):
    """An agent's return value that names no interaction of its session, or is no reward."""


@dataclass(frozen=True)
class AgentEntry:
    """A resolved agent: ``fn`` the coroutine function to call, ``areal`` whether it follows
    AReaL's contract (``fn(data, base_url=, api_key=, http_client=)``) or this package's
    (``fn(base_url, api_key, record)``), ``name`` for log lines."""

    fn: Callable[..., Any]
    areal: bool
    name: str
    target: Any = None
    """What ``mode: subproc`` pickles to a worker: the agent object (or function)."""


def _load(spec: str, key: str) -> Any:
    """``load_object``, with a missing OpenAI Agents SDK refused in one line naming the extra."""
    module_name, _ = split_spec(spec, key)
    try:
        importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "agents":
            raise ValueError(
                f"{key}: {spec} needs the OpenAI Agents SDK (module 'agents'), which is not "
                f"installed: {AGENTS_EXTRA}"
            ) from None
    except Exception:  # noqa: BLE001 - load_object reports it in its one line
        pass
    return load_object(spec, key)


def resolve_agent(agent: Any, key: str) -> AgentEntry:
    """The agent ``rollout.workflow_kwargs.agent`` names (a dotted path or the object).

    A class is instantiated without arguments and its ``run`` used; an object with a ``run``
    method, or a function taking ``**kwargs`` whose first parameter is not ``base_url``,
    follows AReaL's contract; any other function this package's.

    Raises:
        ValueError: one line naming ``key``: missing, not loadable, not async.
    """
    if agent is None:
        raise ValueError(f"{key}: required (package.module:function or module:AgentClass)")
    obj = _load(agent, key) if isinstance(agent, str) else agent
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001 - named in the one line
            raise ValueError(f"{key}: {name}() failed: {type(exc).__name__}: {exc}") from None
    run = getattr(obj, "run", None)
    if not (inspect.isfunction(obj) or inspect.ismethod(obj)) and callable(run):
        fn, areal = run, True
    else:
        fn = obj
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        areal = takes_kwargs and (not params or params[0].name != "base_url")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"{key}: {agent!r} must be an async function (or a class whose run is)")
    return AgentEntry(fn, areal, name, obj)


def run_in_subprocess(target: Any, data: dict[str, Any], env: dict[str, str]) -> Any:
    """``mode: subproc``, in a worker process: AReaL's ``run(data)`` with ``env`` (the
    session's ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``) set, so a default
    ``openai.AsyncOpenAI()`` reaches the session."""
    os.environ.update(env)
    run = target if inspect.isfunction(target) else target.run
    return asyncio.run(_run_and_close_clients(run, data))


_CLOSE_WAIT_S = 5.0
"""How long a worker waits for the agent's unclosed clients to close after an episode."""


async def _run_and_close_clients(run: Callable[..., Any], data: dict[str, Any]) -> Any:
    """``await run(data)``, then the clients it left open closed on this loop, before
    ``asyncio.run`` closes it: an ``openai.AsyncOpenAI()`` that is not closed schedules its
    ``aclose`` when collected, and collected in a later episode's loop it closed its
    connections on this (closed) one, a 22-line "Event loop is closed" traceback each."""
    try:
        return await run(data)
    finally:
        gc.collect()  # the unreachable clients: their __del__ schedules aclose here
        closing = [t for t in asyncio.all_tasks() if _closes(t) and t is not asyncio.current_task()]
        if closing:
            await asyncio.wait(closing, timeout=_CLOSE_WAIT_S)


def _closes(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` runs a client's ``aclose`` (httpx's, as openai's client schedules it)."""
    return getattr(task.get_coro(), "__qualname__", "").endswith("aclose")


def discounted_rewards(own: list[float | None], discount: float) -> list[float]:
    """AReaL's backward discount over interactions in creation order: the last keeps its own
    reward (0 if None), each earlier one gets ``own[i] + discount * reward[i + 1]``."""
    rewards = [0.0] * len(own)
    later = 0.0
    for i in range(len(own) - 1, -1, -1):
        later = (own[i] or 0.0) + (discount * later if i < len(own) - 1 else 0.0)
        rewards[i] = later
    return rewards


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InteractionRewardError(f"{what} is {value!r}, not a finite number")
    return float(value)


def interaction_rewards(
    n_calls: int, interactions: dict[str, list[int]], result: Any, discount: float
) -> list[float]:
    """Each call's reward from an AReaL agent's return value ``result`` (see the module doc).

    Args:
        n_calls: calls the session recorded, in creation order.
        interactions: completion / response id -> indices of its calls (its choices).
        result: a number (the last call's reward) or ``{id: reward}``.
        discount: ``rollout.agent.turn_discount``.

    Raises:
        InteractionRewardError: ``result`` is neither, or names an id with no call.
    """
    own: list[float | None] = [None] * n_calls
    if isinstance(result, dict):
        for interaction_id, value in result.items():
            calls = interactions.get(interaction_id) if isinstance(interaction_id, str) else None
            if not calls:
                raise InteractionRewardError(
                    f"reward keyed by {str(interaction_id)[:60]!r}, which no call of the "
                    "episode answered"
                )
            for index in calls:
                own[index] = _finite(value, f"the reward of {interaction_id!r}")
    elif n_calls:
        own[-1] = _finite(result, "the reward")
    else:
        _finite(result, "the reward")
    return discounted_rewards(own, discount)


class DropCounter:
    """Episodes dropped since the last :meth:`take` (added on the rollout loop's thread, taken
    on the trainer's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0

    def add(self, why: str) -> None:
        """Count one dropped episode and log ``why`` in one line."""
        logger.warning("agent episode dropped: %s", why)
        with self._lock:
            self._n += 1

    def take(self) -> int:
        with self._lock:
            n, self._n = self._n, 0
        return n
