"""Episodes that end: an agent that never returns is cut at ``rollout.episode_timeout_s`` (its
group dropped and counted, the run going on), an agent's session is closed before its
trajectory is read (a call still running is cancelled, later calls get 404), and the agent
endpoint keeps a session to the episode's token budget. Through the real ``openai`` client and
the agent endpoint over loopback HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from agentic_helpers import tiny_model_and_tokenizer
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.executor import RolloutSetup, arun_group
from areal_m2po.rollout.sync_executor import SyncRolloutExecutor
from areal_m2po.rollout.workflows.agent.workflow import AgentWorkflow

HOLD = "hold this call"
"""A prompt holding this text makes :class:`OneTokenEngine` wait for its ``release``."""


class OneTokenEngine(ScriptOnlyEngine):
    """Answers a call with ``max_new_tokens`` copies of one token (finish ``length``); a call
    whose prompt holds :data:`HOLD` waits for ``release`` first (``held`` counts such calls,
    ``cancelled`` those cancelled while waiting). A scripted engine: the behaviour under test
    is the endpoint's and the executor's, and a real model's text is not needed for it."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.token = tokenizer("a", add_special_tokens=False)["input_ids"][0]
        self.requests: list[ModelRequest] = []
        self.release = asyncio.Event()
        self.held = 0
        self.cancelled = 0

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if HOLD in self.tokenizer.decode(request.input_ids):
            self.held += 1
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        n = request.sampling.max_new_tokens
        return ModelResponse(
            list(request.input_ids), [self.token] * n, [-0.5] * n, [0] * n, "length"
        )


def _context(tokenizer: Any, budget: int | None = None) -> WorkflowContext:
    g = GenerationConfig(n_samples=1, max_new_tokens=8, temperature=1.0)
    return WorkflowContext(tokenizer, g, SamplingParams.from_gconfig(g), [2], None, budget)


def _ask(base_url: str, api_key: str, text: str, **kwargs: Any) -> Any:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    return client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": text}], **kwargs
    )


async def sometimes_hanging_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """One call; then, on a record whose question says so, never returns (its session's
    address and key are kept in ``record["sessions"]``)."""
    await _ask(base_url, api_key, record["question"])
    if "hang" in record["question"]:
        record["sessions"].append((base_url, api_key))
        await asyncio.Event().wait()
    return 1.0


def _records() -> list[dict[str, Any]]:
    sessions: list[tuple[str, str]] = []  # shared by the copies the executor makes
    return [
        {"question": q, "answer": "1", "prompt_ids": [5, 6], "sessions": sessions}
        for q in ("hang, please", "answer, please")
    ]


class _Loader:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def next_batch(self) -> tuple[list[dict[str, Any]], int]:
        return [dict(r) for r in self.records], 0


def test_an_agent_that_never_returns_ends_its_episode_at_the_timeout() -> None:
    """Of a batch of two groups, the one whose agent hangs is dropped at the timeout and
    counted; the other is trained on. The hung agent's session is closed: a call it makes
    later gets 404. Evaluation counts the hung episode as failed."""
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = OneTokenEngine(tokenizer)
    context = _context(tokenizer)
    workflow = AgentWorkflow(context, agent=sometimes_hanging_agent)
    records = _records()
    setup = RolloutSetup(engine, workflow, context, 2, "agent", episode_timeout_s=3.0)
    executor = SyncRolloutExecutor(setup, _Loader(records), staleness=0, seed=1)
    try:
        executor.start(lambda: iter(()), 0)
        batch, info = executor.next_batch()
        assert info["rollout/n_episode_timeouts"] == 1.0
        assert info["rollout/n_dropped_groups"] == 1.0
        assert batch["input_ids"].shape[0] == 1 and info["agent/episodes"] == 1.0
        assert workflow.proxy.sessions == {}  # every session closed

        (base_url, api_key), *_ = records[0]["sessions"]
        with pytest.raises(openai.NotFoundError, match="no open agent session"):
            executor.run(_ask(base_url, api_key, "still there?"))

        sums = executor.evaluate(records, batch_size=2)
        assert sums["timed_out"] == 1.0 and sums["n"] == 2.0 and sums["correct"] == 1.0
        assert sums["reward_mean"] == 1.0  # the hung episode adds nothing
    finally:
        executor.close()


def test_a_batch_of_timed_out_episodes_stops_with_one_line() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = OneTokenEngine(tokenizer)
    context = _context(tokenizer)
    workflow = AgentWorkflow(context, agent=sometimes_hanging_agent)
    setup = RolloutSetup(engine, workflow, context, 2, "agent", episode_timeout_s=1.0)
    executor = SyncRolloutExecutor(setup, _Loader(_records()[:1]), staleness=0, seed=1)
    try:
        executor.start(lambda: iter(()), 0)
        with pytest.raises(RuntimeError, match="1 episodes past rollout.episode_timeout_s"):
            executor.next_batch()
    finally:
        executor.close()


async def leaving_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """One call answered; a second started and left running when the agent returns (kept in
    ``record["late"]``)."""
    await _ask(base_url, api_key, record["question"])
    late = asyncio.ensure_future(_ask(base_url, api_key, HOLD))
    record["late"].append(late)
    engine = record["engine"]
    while not engine.held:  # the call has reached the engine
        await asyncio.sleep(0.01)
    return 1.0


def test_a_call_running_when_the_agent_returns_is_cancelled_and_refused() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = OneTokenEngine(tokenizer)
    workflow = AgentWorkflow(_context(tokenizer), agent=leaving_agent)
    record: dict[str, Any] = {"question": "q", "answer": "1", "late": [], "engine": engine}

    async def run() -> Any:
        group = await arun_group(workflow, engine, record, 1)
        engine.release.set()  # a call not cancelled would now be answered
        with pytest.raises(openai.NotFoundError, match="no open agent session"):
            await asyncio.wait_for(record["late"][0], 30)
        return group

    try:
        group = asyncio.run(run())
    finally:
        workflow.close()
    assert engine.held == 1 and engine.cancelled == 1
    assert group is not None and group.trajectories[0].info["calls"] == 1


async def long_agent(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    """Asks once, then goes on asking in the same conversation until refused; keeps the
    replies and the refusal in ``record["seen"]``, and gives up with the refusal."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": record["question"]}]
    while True:
        try:
            reply = await client.chat.completions.create(model="policy", messages=messages)
        except openai.BadRequestError as exc:
            record["seen"].append(exc)
            raise
        record["seen"].append(reply)
        messages += [reply.choices[0].message, {"role": "user", "content": "more"}]


def test_an_agent_session_keeps_to_the_episode_budget() -> None:
    """Budget = the first prompt + 5: the first call gets 5 tokens (not 8), the next call's
    prompt leaves nothing and is refused with 400 context_length_exceeded; the episode
    ends there with finish reason length, is trained on (reward 0: the agent gave up) and
    holds exactly the budget."""
    tokenizer = tiny_model_and_tokenizer()[1]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "q"}], add_generation_prompt=True, tokenize=False
    )
    prompt_len = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    engine = OneTokenEngine(tokenizer)
    workflow = AgentWorkflow(_context(tokenizer, budget=prompt_len + 5), agent=long_agent)
    record: dict[str, Any] = {"question": "q", "answer": "1", "seen": []}
    try:
        group = asyncio.run(arun_group(workflow, engine, record, 1))
    finally:
        workflow.close()
    assert [r.sampling.max_new_tokens for r in engine.requests] == [5]
    first, refusal = record["seen"]
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 5
    assert refusal.status_code == 400 and refusal.code == "context_length_exceeded"
    assert f"rollout.max_episode_tokens is {prompt_len + 5}" in refusal.message
    assert group is not None and group.stats["agent/budget_ended_episodes"] == 1.0
    traj = group.trajectories[0]
    assert len(traj.input_ids) == prompt_len + 5 and traj.no_eos and traj.reward == 0.0
