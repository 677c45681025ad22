"""Faults stay with the request that caused them, in process: the HF engine refuses a request
that cannot fit before it is batched, a batch whose ``generate`` call fails still answers
every request that succeeds alone, the executor drops only a refused record's group (and counts
it), and the agent endpoint answers a refused call with a 400 while other sessions go on, as
the real ``openai`` client sees it over loopback."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from agentic_helpers import VersionedTinyEngine, tiny_model_and_tokenizer

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, RequestError, SamplingParams
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.rollout.engines.request_limits import RequestLimits
from areal_m2po.rollout.executor import RolloutSetup
from areal_m2po.rollout.openai.endpoint import AgentProxy
from areal_m2po.rollout.sync_executor import SyncRolloutExecutor

OOV = 10_000  # the tiny model has 99 token ids
SAMPLING = SamplingParams(max_new_tokens=4, temperature=1.0)


@pytest.fixture(scope="module")
def engine() -> VersionedTinyEngine:
    model, tokenizer = tiny_model_and_tokenizer()
    return VersionedTinyEngine(model, tokenizer)


def _eight(bad: list[int]) -> list[ModelRequest]:
    """Eight requests of one sampling (one batch, one ``generate`` call); the fourth is ``bad``."""
    contexts = [[5 + i, 6, 7] for i in range(8)]
    contexts[3] = bad
    return [ModelRequest(c, SAMPLING) for c in contexts]


def _answer(engine: Any, requests: list[ModelRequest]) -> list[Any]:
    async def run() -> list[Any]:
        return await asyncio.gather(
            *(engine.agenerate(r) for r in requests), return_exceptions=True
        )

    return asyncio.run(run())


def _check_seven_answered(answers: list[Any], requests: list[ModelRequest]) -> BaseException:
    for i, (answer, request) in enumerate(zip(answers, requests)):
        if i == 3:
            continue
        assert not isinstance(answer, BaseException), (i, answer)
        assert answer.input_ids == request.input_ids and 1 <= answer.output_len <= 4
    assert isinstance(answers[3], BaseException)
    return answers[3]


def test_a_refused_request_in_a_batch_of_eight_leaves_seven_answered(engine):
    """An out-of-vocabulary id (an index error inside ``generate``, failing the whole batch
    without the check) is refused before batching, alone, naming the vocabulary."""
    requests = _eight([5, OOV, 7])
    error = _check_seven_answered(_answer(engine, requests), requests)
    assert isinstance(error, RequestError)
    assert str(error) == (
        f"HF engine: input_ids: token id {OOV} at position 1 is outside the vocabulary [0, 99)"
    )


def test_a_prompt_longer_than_the_model_is_refused_naming_the_limit(engine):
    """The tiny model has 512 positions: 509 prompt tokens + 4 new ones do not fit, 508 do."""
    with pytest.raises(RequestError) as caught:
        _answer_one(engine, ModelRequest([5] * 509, SAMPLING))
    assert str(caught.value) == (
        "HF engine: input_ids: 509 tokens + max_new_tokens 4 exceed the context of 512 tokens "
        "(max_position_embeddings)"
    )
    assert _answer_one(engine, ModelRequest([5] * 508, SAMPLING)).output_len >= 1


def _answer_one(engine: Any, request: ModelRequest) -> Any:
    answer = _answer(engine, [request])[0]
    if isinstance(answer, BaseException):
        raise answer
    return answer


def test_a_failing_generate_call_fails_only_the_request_that_fails_alone(engine):
    """With the check off, the bad id reaches ``generate`` and fails the batched call; each
    request then runs alone, so seven are answered and the eighth gets its own error."""
    engine.limits, kept = RequestLimits(), engine.limits
    try:
        requests = _eight([5, OOV, 7])
        error = _check_seven_answered(_answer(engine, requests), requests)
    finally:
        engine.limits = kept
    assert isinstance(error, IndexError) and not isinstance(error, RequestError)


class _OneSample(RolloutWorkflow):
    """One completion per episode, every group kept, reward 1."""

    def __init__(self, context: WorkflowContext) -> None:
        self.context = context

    async def arun_episode(self, engine: Any, record: dict[str, Any]) -> Trajectory:
        request = ModelRequest(list(record["prompt_ids"]), self.context.sampling)
        return Trajectory.from_response(await engine.agenerate(request), 1.0)

    async def afinish_group(
        self, record: dict[str, Any], trajectories: list[Trajectory]
    ) -> TrajectoryGroup:
        return TrajectoryGroup(trajectories)


class _Loader:
    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def next_batch(self) -> tuple[list[dict[str, Any]], int]:
        return [dict(r) for r in self.records], 0


def _sync_executor(engine: Any, records: list[dict[str, Any]]) -> SyncRolloutExecutor:
    g = GenerationConfig(n_samples=2, max_new_tokens=4)
    context = WorkflowContext(
        engine.generator.tokenizer, g, SamplingParams.from_gconfig(g), engine.eos_ids, None
    )
    setup = RolloutSetup(engine, _OneSample(context), context, engine.pad_id)
    return SyncRolloutExecutor(setup, _Loader(records), staleness=0, seed=1)


def test_the_executor_drops_only_a_refused_records_group_and_counts_it(engine, caplog):
    records = [
        {"question": "fine", "prompt_ids": [5, 6, 7]},
        {"question": "too long", "prompt_ids": [5] * 600},
        {"question": "fine too", "prompt_ids": [8, 9]},
    ]
    executor = _sync_executor(engine, records)
    try:
        with caplog.at_level("WARNING", logger="areal_m2po.rollout"):
            batch, info = executor.next_batch()
    finally:
        executor.close()
    assert batch["input_ids"].shape[0] == 4  # two groups of two
    assert info["rollout/n_refused_groups"] == 1 and info["rollout/n_dropped_groups"] == 1
    warning = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert warning == [
        "record 'too long' dropped: the engine refused it: HF engine: input_ids: 600 tokens "
        "+ max_new_tokens 4 exceed the context of 512 tokens (max_position_embeddings)"
    ]


def test_a_batch_of_refused_records_stops_the_run_naming_the_refusal(engine):
    executor = _sync_executor(engine, [{"question": "q", "prompt_ids": [OOV]}])
    try:
        with pytest.raises(RuntimeError) as caught:
            executor.next_batch()
    finally:
        executor.close()
    assert "every group of a batch was dropped" in str(caught.value)
    assert f"1 refused by the engine, e.g. HF engine: input_ids: token id {OOV}" in str(
        caught.value
    )


def test_the_agent_endpoint_answers_a_refused_call_with_400_and_other_sessions_go_on(engine):
    tokenizer = engine.generator.tokenizer
    proxy = AgentProxy(tokenizer, [tokenizer.eos_token_id])
    sampling = SamplingParams(max_new_tokens=6, temperature=0.9)
    long_text = " ".join(["seven"] * 600)

    async def run() -> tuple[Any, Any, Any]:
        one = proxy.open_session(engine, sampling, 6, 0.9, 1.0)
        other = proxy.open_session(engine, sampling, 6, 0.9, 1.0)
        a = openai.AsyncOpenAI(base_url=one.base_url, api_key=one.api_key, max_retries=0)
        b = openai.AsyncOpenAI(base_url=other.base_url, api_key=other.api_key, max_retries=0)
        too_long = a.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": long_text}]
        )
        fine = b.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "hi"}]
        )
        refused, answered = await asyncio.gather(too_long, fine, return_exceptions=True)
        again = await a.chat.completions.create(  # the refused session itself goes on
            model="policy", messages=[{"role": "user", "content": "short"}]
        )
        return refused, answered, again

    try:
        refused, answered, again = asyncio.run(run())
    finally:
        proxy.close()
    assert isinstance(refused, openai.BadRequestError) and refused.status_code == 400
    assert "exceed the context of 512 tokens (max_position_embeddings)" in refused.message
    assert not isinstance(answered, BaseException)
    assert answered.choices[0].message.role == "assistant"
    assert again.usage is not None and again.usage.completion_tokens >= 1
