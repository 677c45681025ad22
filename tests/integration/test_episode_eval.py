"""Held-out evaluation with the configured workflow: the multi-turn workflow's greedy episodes
(success, tool use, second turns, turns) through the executor the trainer calls."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from agentic_helpers import tiny_model_and_tokenizer
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.executor import RolloutSetup
from areal_m2po.rollout.sync_executor import SyncRolloutExecutor
from areal_m2po.rollout.workflows.multi_turn.evaluation import evaluate_multi_turn
from areal_m2po.rollout.workflows.multi_turn.workflow import MultiTurnWorkflow

# question -> (first reply, reply after the tool's result or None)
SCRIPT = {
    "What is 12 * 3?": ("<calc>12*3</calc>", "{result}"),  # tool, copied: solved, 2 turns
    "What is 7 * 8?": ("56", None),  # answered directly: solved, 1 turn
    "What is 9 * 9?": ("80", None),  # wrong, 1 turn
    "What is 11 * 11?": ("<calc>11*11</calc>", "100"),  # tool, miscopied: wrong, 2 turns
}


class ScriptedPolicy(ScriptOnlyEngine):
    """Replies by the question in the context (episodes run concurrently, in any order);
    records every request's sampling."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.samplings: list[SamplingParams] = []

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.samplings.append(request.sampling)
        text = self.tokenizer.decode(request.input_ids)
        question = next(q for q in SCRIPT if q in text)
        first, after = SCRIPT[question]
        result = re.findall(r"<result>(.*?)</result>", text)
        reply = first if not result else f"{after.format(result=result[-1])}<|im_end|>"
        if reply == first and "<calc>" not in reply:
            reply += "<|im_end|>"
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return ModelResponse(list(request.input_ids), ids, [0.0] * len(ids), [0] * len(ids), "stop")


def _records(tokenizer: Any) -> list[dict[str, Any]]:
    records = []
    for question in SCRIPT:
        a, b = (int(x) for x in re.findall(r"\d+", question))
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        records.append({"question": question, "answer": str(a * b), "prompt_ids": ids})
    return records


def _context(tokenizer: Any) -> WorkflowContext:
    g = GenerationConfig(n_samples=4, max_new_tokens=40, temperature=1.0)
    return WorkflowContext(tokenizer, g, SamplingParams.from_gconfig(g), [2], None)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_executor_evaluates_greedy_multi_turn_episodes(batch_size: int) -> None:
    _, tokenizer = tiny_model_and_tokenizer()
    engine = ScriptedPolicy(tokenizer)
    context = _context(tokenizer)
    workflow = MultiTurnWorkflow(context, environment="calculator", max_turns=3)
    setup = RolloutSetup(engine, workflow, context, 2)
    executor = SyncRolloutExecutor(setup, loader=None, staleness=0, seed=1)
    try:
        sums = executor.evaluate(_records(tokenizer), batch_size)
    finally:
        executor.close()
    assert sums == {
        "n": 4.0,
        "correct": 2.0,
        "tool_use_fraction": 2.0,
        "second_turn_fraction": 2.0,
        "turns_mean": 6.0,
    }
    assert len(engine.samplings) == 6  # one request per policy turn, one episode per record
    assert all(s.greedy for s in engine.samplings)


def test_eval_helper_reports_the_same_fractions() -> None:
    _, tokenizer = tiny_model_and_tokenizer()
    result = asyncio.run(
        evaluate_multi_turn(
            ScriptedPolicy(tokenizer),
            _context(tokenizer),
            _records(tokenizer),
            batch_size=2,
            environment="calculator",
        )
    )
    assert (result.n, result.solved, result.used_tool) == (4, 0.5, 0.5)
    assert (result.second_turn, result.mean_turns) == (0.5, 1.5)
    assert result.solved_se == pytest.approx((0.25 / 4) ** 0.5)


def test_aevaluate_result_missing_a_metric_is_refused_in_one_line() -> None:
    _, tokenizer = tiny_model_and_tokenizer()

    class Forgetful(MultiTurnWorkflow):
        async def aevaluate(self, engine, record):  # type: ignore[no-untyped-def]
            return {"correct": 1.0}

    context = _context(tokenizer)
    setup = RolloutSetup(ScriptedPolicy(tokenizer), Forgetful(context), context, 2, "w")
    executor = SyncRolloutExecutor(setup, None, 0, 1)
    with pytest.raises(RuntimeError, match="rollout.workflow w: aevaluate returned no .*turns"):
        executor.evaluate(_records(tokenizer)[:1], 1)
    executor.close()
