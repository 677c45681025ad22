"""An agent endpoint's session: one episode's chat-completions calls, recorded token for token,
and the trajectory they merge into (see :mod:`.endpoint`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, SamplingParams
from areal_m2po.api.workflow_api import Trajectory
from areal_m2po.rollout.openai.limits import shown

__all__ = ["AgentSession", "CallRecord", "SessionClosed"]


@dataclass
class CallRecord:
    """One chat completion of a session, as the engine saw and produced it.

    Attributes:
        messages / tools: the request, normalised.
        reply: the assistant message returned (``content``, ``tool_calls``).
        prompt_ids: the context given to the engine.
        completion_ids / logprobs / versions: the generated tokens, their behaviour log-probs
            (nats) and weight versions, [len(completion_ids)] each.
        finish_reason: the engine's (``stop``, ``length``, ``abort``).
        parent: index of the call whose prompt and completion ``prompt_ids`` starts with,
            or None.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    reply: dict[str, Any]
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    parent: int | None


@dataclass
class AgentSession:
    """One episode's calls; see the module doc."""

    session_id: str
    api_key: str
    engine: InferenceEngine
    loop: asyncio.AbstractEventLoop
    sampling: SamplingParams
    max_new_tokens_limit: int
    train_temperature: float
    train_top_p: float
    base_url: str = ""
    calls: list[CallRecord] = field(default_factory=list)
    interactions: dict[str, list[int]] = field(default_factory=dict)
    """Completion / response id -> indices in :attr:`calls` of its choices."""
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Response id -> its conversation and output, for ``previous_response_id``."""
    max_episode_tokens: int | None = None
    budget_refused: bool = False
    """A call was refused because the prompt left no room in the episode's budget."""
    closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _running: set[concurrent.futures.Future[Any]] = field(default_factory=set, repr=False)

    def close(self) -> None:
        """End the session: calls still running are cancelled and never recorded; later
        calls are refused (idempotent)."""
        with self._lock:
            self.closed = True
            running = list(self._running)
        for future in running:
            future.cancel()

    def submit(self, request: ModelRequest) -> concurrent.futures.Future[Any]:
        """Start ``request`` on the session's engine (its event loop), unless closed."""
        with self._lock:
            if self.closed:
                raise SessionClosed(self.session_id)
            future = asyncio.run_coroutine_threadsafe(self.engine.agenerate(request), self.loop)
            self._running.add(future)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._running.discard(future)

    def record(self, call: CallRecord) -> None:
        """Append ``call`` to :attr:`calls` (SessionClosed once the session is closed)."""
        with self._lock:
            if self.closed:
                raise SessionClosed(self.session_id)
            self.calls.append(call)

    def chain(self) -> list[int]:
        """Indices of the calls merged into the trajectory: the last call and its ancestors."""
        if not self.calls:
            return []
        chain = [len(self.calls) - 1]
        while (parent := self.calls[chain[-1]].parent) is not None:
            chain.append(parent)
        return chain[::-1]

    def trajectory(self, reward: float) -> Trajectory:
        """The last call's tokens, with every completion of its chain in the loss mask.

        Raises:
            ValueError: the session made no call.
        """
        chain = self.chain()
        if not chain:
            raise ValueError("the agent made no chat-completions call")
        last = self.calls[chain[-1]]
        ids = last.prompt_ids + last.completion_ids
        n = len(ids)
        mask, logprobs, versions = [False] * n, [0.0] * n, [-1] * n
        for index in chain:
            call = self.calls[index]
            start = len(call.prompt_ids)
            for offset, token in enumerate(call.completion_ids):
                assert ids[start + offset] == token, "a merged call's tokens must be a prefix"
                mask[start + offset] = True
                logprobs[start + offset] = float(call.logprobs[offset])
                versions[start + offset] = int(call.versions[offset])
        return Trajectory(
            input_ids=ids,
            loss_mask=mask,
            logprobs=logprobs,
            versions=versions,
            prompt_len=len(self.calls[chain[0]].prompt_ids),
            reward=float(reward),
            no_eos=last.finish_reason != "stop" or self.budget_refused,
            info={"calls": len(self.calls), "merged_calls": len(chain)},
        )


class SessionClosed(Exception):
    """A call reached a session whose episode has ended (HTTP 404)."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"no open agent session {shown(session_id)} (the episode has ended)")
