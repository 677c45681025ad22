"""The calculator tool, the tool-use and retry environments, and the multiplication task."""

from __future__ import annotations

import asyncio
import math

import pytest

from areal_m2po.dataset.loader import load_records
from areal_m2po.dataset.multiplication import make_multiplication_split
from areal_m2po.reward.math_reward import math_reward_fn
from areal_m2po.rollout.workflows.multi_turn.calculator import CalculatorError, calculate
from areal_m2po.rollout.workflows.multi_turn.tool_env import (
    CalculatorEnvironment,
    Environment,
    EnvReply,
    RetryEnvironment,
    grader_from_fn,
    make_environment,
)


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("37*45", "1665"),
        (" 347 * 58 ", "20126"),
        ("347 x 58", "20126"),
        ("1/4", "0.25"),
        ("2/3", "0.666667"),
        ("(1+2)*3-4", "5"),
        ("-5+2", "-3"),
        ("--5", "5"),
        ("3.5*2", "7"),
        ("0.1+0.2", "0.3"),  # exact, not 0.30000000000000004
        ("1/3*3", "1"),
        ("-1/8", "-0.125"),
    ],
)
def test_calculator_values(expression: str, value: str) -> None:
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("", "empty"),
        ("2**100", "**"),
        ("1/0", "division by zero"),
        ("1/(2-2)", "division by zero"),
        ("__import__('os').system('x')", "unsupported syntax"),
        ("abc", "unsupported syntax"),
        ("1+", "not an arithmetic expression"),
        ("9" * 31, "too large"),
        ("10000000000*10000000000*10000000000*10", "too large"),
        ("1" + "+1" * 150, "longer than"),
        ("-" * 40 + "1", "nested too deeply"),
        ("(" * 40 + "1" + ")" * 40, None),  # parentheses add no depth: a valid expression
        ("True+1", "unsupported literal"),
        ("'a'*3", "unsupported literal"),
        ("1e400", "too large"),
        ("[1,2]", "unsupported syntax"),
    ],
)
def test_calculator_refuses(expression: str, message: str | None) -> None:
    if message is None:
        assert calculate(expression) == "1"
        return
    with pytest.raises(CalculatorError, match=message.replace("*", r"\*")):
        calculate(expression)


RECORD = {"question": "What is 347 * 58?", "answer": "20126"}


def _step(env: Environment, text: str, last_turn: bool) -> EnvReply:
    return asyncio.run(env.step(text, last_turn))


def test_calculator_environment_answers_tool_calls_and_grades_answers() -> None:
    env = CalculatorEnvironment(RECORD, grader_from_fn(RECORD, math_reward_fn))
    reply = _step(env, "Let me compute. <calc>347*58</calc>", last_turn=False)
    assert (reply.message, reply.tool_call) == ("<result>20126</result>", True)
    bad = _step(env, "<calc>347 ** 58</calc>", last_turn=False)
    assert bad.message is not None and bad.message.startswith("<error>") and bad.tool_call
    assert _step(env, "<calc>1/0</calc>", False).message == "<error>division by zero</error>"
    assert _step(env, "<calc>347*58", False).message == "<error><calc> without </calc></error>"
    final = _step(env, "20126", last_turn=False)
    assert (final.message, final.reward, final.tool_call) == (None, 1.0, False)
    assert _step(env, "20125", last_turn=True).reward == 0.0
    # a tool call on the last turn ends the episode unanswered and unrewarded, even when its
    # text holds the right number
    last = _step(env, "<calc>20126*1</calc>", last_turn=True)
    assert (last.message, last.reward, last.tool_call) == (None, 0.0, True)
    assert env.stop == ("</calc>",)


def test_retry_environment_asks_again_until_the_last_turn() -> None:
    env = RetryEnvironment(RECORD, grader_from_fn(RECORD, math_reward_fn))
    again = _step(env, "20000", last_turn=False)
    assert again.message is not None and "wrong" in again.message
    assert _step(env, "20000", last_turn=True).message is None
    assert _step(env, "The answer is 20126.", last_turn=False).reward == 1.0


def test_reward_function_errors_score_zero_not_raise() -> None:
    def broken(prompt: str, completion: str, answer: str) -> float:
        raise RuntimeError("boom")

    env = make_environment("retry", RECORD, grader_from_fn(RECORD, broken))
    assert _step(env, "20126", last_turn=True).reward == 0.0
    nan = make_environment("retry", RECORD, grader_from_fn(RECORD, lambda *a: math.nan))
    assert _step(nan, "20126", last_turn=True).reward == 0.0
    with pytest.raises(ValueError, match="unknown environment 'nope'; known: calculator, retry"):
        make_environment("nope", RECORD, grader_from_fn(RECORD, math_reward_fn))


def test_multiplication_task_splits() -> None:
    test = make_multiplication_split("test")
    train = make_multiplication_split("train", n=2000, seed=3)
    assert len(test) == 256 and len(make_multiplication_split("test", n=1024)) == 1024
    assert {r["question"] for r in test}.isdisjoint(
        r["question"] for r in make_multiplication_split("train")
    )
    for record in test[:50] + train[:50]:
        a, b = record["question"].split("What is ")[1].split("?")[0].split(" * ")
        assert 100 <= int(a) <= 999 and 10 <= int(b) <= 99
        assert record["answer"] == str(int(a) * int(b))
        assert "<calc>" in record["question"]
    assert make_multiplication_split("train", n=5, seed=3) == train[:5]
    assert make_multiplication_split("train", n=5, seed=4) != train[:5]
    assert load_records("builtin:multiplication", split="test", max_samples=3) == test[:3]
    with pytest.raises(ValueError, match="asked for n=2000"):
        make_multiplication_split("test", n=2000)
    with pytest.raises(ValueError, match="known: builtin:arithmetic, builtin:multiplication"):
        load_records("builtin:nope")
