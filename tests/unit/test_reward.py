"""Tests for answer extraction, the math reward, reward-fn loading and RewardRunner."""

from __future__ import annotations

import logging
import math
import threading

import pytest

from areal_m2po.reward import (
    RewardRunner,
    extract_answer,
    extract_ground_truth,
    load_reward_fn,
    math_reward_fn,
)
from areal_m2po.reward import math_reward as math_reward_module


# ------------------------------------------------------------------ extraction
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so 48 + 24 = 72\n#### 72", "72"),
        ("#### 1 then #### 5", "5"),
        ("####-3", "-3"),
        ("#### $1,234.", "1234"),
        ("#### 2.50 dollars", "2.5"),
        ("#### 72.0", "72"),
        ("The answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{ 7 }", "7"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\text{a}{b}} done", "\\text{a}{b}"),
        ("\\boxed{3} and an unterminated \\boxed{4", "3"),
        ("#### 9 beats \\boxed{8}", "9"),
        ("59 + 63 = 122", "122"),
        ("It is 122.", "122"),
        ("The temperature is -3 degrees", "-3"),
        ("5-3 = 2, so 10-3", "3"),
        ("pi is about 3.14159.", "3.14159"),
        ("total: 1,234,567 items", "1234567"),
        ("lists 1,2,3", "3"),
        ("no digits here", None),
        ("", None),
        ("\u2212 7 and \u22127", "-7"),
    ],
)
def test_extract_answer(text: str, expected: str | None) -> None:
    assert extract_answer(text) == expected


def test_extract_ground_truth_forms() -> None:
    assert extract_ground_truth("Natalia sold 48/2 = 24 clips.\n#### 72") == "72"
    assert extract_ground_truth(" 72 ") == "72"
    assert extract_ground_truth("1,234") == "1234"
    assert extract_ground_truth("\\frac{1}{2}") == "\\frac{1}{2}"
    assert extract_ground_truth("\\boxed{5}") == "5"
    assert extract_ground_truth("") is None


# ------------------------------------------------------------------ reward
@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("122", "122", 1.0),
        ("The answer is 122.", "122", 1.0),
        ("122", "123", 0.0),
        ("72.0", "72", 1.0),
        ("\\boxed{1,234}", "1234", 1.0),
        ("1234", "1,234", 1.0),
        ("She made $72 in May.\n#### 72", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),
        ("#### 71", "blah\n#### 72", 0.0),
        ("I cannot tell.", "72", 0.0),
        ("-3", "-3", 1.0),
        ("3", "-3", 0.0),
        ("2.5", "2.50", 1.0),
    ],
)
def test_math_reward_numeric(completion: str, answer: str, reward: float) -> None:
    assert math_reward_fn("prompt", completion, answer, extra_field=1) == reward


def test_numeric_case_does_not_call_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> bool:
        raise AssertionError("math_verify must not be called for numbers")

    monkeypatch.setattr(math_reward_module, "_math_verify_equal", boom)
    assert math_reward_fn("", "so #### 72", "72") == 1.0
    assert math_reward_fn("", "so #### 71", "72") == 0.0
    assert math_reward_fn("", "no number", "72") == 0.0


def test_math_verify_fallback() -> None:
    pytest.importorskip("math_verify")
    assert math_reward_fn("", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}") == 1.0
    assert math_reward_fn("", "\\boxed{0.5}", "\\frac{1}{2}") == 1.0
    assert math_reward_fn("", "\\boxed{\\frac{2}{4}}", "\\frac{1}{2}") == 1.0
    assert math_reward_fn("", "\\boxed{\\frac{1}{3}}", "\\frac{1}{2}") == 0.0
    assert math_reward_fn("", "\\boxed{\\frac{144}{2}}", "72") == 1.0


def test_math_verify_errors_count_as_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    math_verify = pytest.importorskip("math_verify")

    def broken_parse(*args: object, **kwargs: object) -> object:
        raise RuntimeError("parser exploded")

    monkeypatch.setattr(math_verify, "parse", broken_parse)
    assert math_reward_fn("", "\\boxed{0.5}", "\\frac{1}{2}") == 0.0


def test_math_verify_in_worker_thread() -> None:
    pytest.importorskip("math_verify")
    with RewardRunner(math_reward_fn, timeout_s=30.0, max_workers=2) as runner:
        rewards, stats = runner.score(
            ["", ""], ["\\boxed{0.5}", "\\boxed{\\frac{1}{3}}"], ["\\frac{1}{2}", "\\frac{1}{2}"]
        )
    assert rewards == [1.0, 0.0]
    assert stats["reward/n_errors"] == 0.0


# ------------------------------------------------------------------ loading
def test_load_reward_fn_both_spellings() -> None:
    assert load_reward_fn("areal_m2po.reward.math_reward:math_reward_fn") is math_reward_fn
    assert load_reward_fn("areal_m2po.reward.math_reward.math_reward_fn") is math_reward_fn


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("no_such_pkg_xyz.module:fn", "cannot import module 'no_such_pkg_xyz.module'"),
        ("areal_m2po.reward.math_reward:nope", "has no attribute 'nope'"),
        ("areal_m2po.reward.math_reward:__all__", "not callable"),
        ("nodots", "malformed"),
        ("", "empty"),
    ],
)
def test_load_reward_fn_errors(spec: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        load_reward_fn(spec)
    message = str(info.value)
    assert fragment in message
    assert repr(spec.strip()) in message or spec == ""
    assert "\n" not in message


# ------------------------------------------------------------------ runner
def _constant(prompt: str, completion: str, answer: str, **extra: object) -> float:
    return float(extra.get("value", 1.0))


def test_runner_scores_in_order_with_extras() -> None:
    with RewardRunner(math_reward_fn, max_workers=3) as runner:
        rewards, stats = runner.score(
            ["p"] * 5, ["1", "2", "x", "#### 4", "\\boxed{5}"], ["1", "3", "3", "4", "5"]
        )
    assert rewards == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert stats == {"reward/n_errors": 0.0, "reward/n_timeouts": 0.0, "reward/n_invalid": 0.0}
    with RewardRunner(_constant) as runner:
        rewards, _ = runner.score(["a", "b"], ["c", "d"], ["e", "f"], [{"value": 0.25}, {}])
    assert rewards == [0.25, 1.0]


def test_runner_raising_fn_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    def fail(prompt: str, completion: str, answer: str) -> float:
        if completion == "ok":
            return 1.0
        raise ValueError("bad sample")

    with caplog.at_level(logging.WARNING, logger="areal_m2po.reward"), RewardRunner(fail) as runner:
        rewards, stats = runner.score(["p"] * 4, ["x", "ok", "y", "z"], ["a"] * 4)
        runner.score(["p"], ["x"], ["a"])
    assert rewards == [0.0, 1.0, 0.0, 0.0]
    assert stats["reward/n_errors"] == 3.0
    messages = [r.getMessage() for r in caplog.records if "bad sample" in r.getMessage()]
    assert len(messages) == 1
    assert "ValueError" in messages[0]


def test_runner_invalid_returns(caplog: pytest.LogCaptureFixture) -> None:
    values = {"nan": math.nan, "inf": math.inf, "str": "1.0", "none": None, "ok": 0.5, "int": 1}

    def fn(prompt: str, completion: str, answer: str) -> object:
        return values[completion]

    with caplog.at_level(logging.WARNING, logger="areal_m2po.reward"), RewardRunner(fn) as runner:
        rewards, stats = runner.score([""] * 6, list(values), [""] * 6)
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    assert stats["reward/n_invalid"] == 4.0
    assert stats["reward/n_errors"] == 0.0
    assert any("not a finite number" in r.getMessage() for r in caplog.records)


def test_runner_timeout_does_not_wait_for_hung_call(caplog: pytest.LogCaptureFixture) -> None:
    release = threading.Event()
    hung_returned = threading.Event()

    def fn(prompt: str, completion: str, answer: str) -> float:
        if completion == "hang":
            release.wait(30.0)
            hung_returned.set()
        return 1.0

    # One worker: the other samples only get scored if a replacement worker takes over.
    runner = RewardRunner(fn, timeout_s=0.5, max_workers=1)
    try:
        with caplog.at_level(logging.WARNING, logger="areal_m2po.reward"):
            rewards, stats = runner.score(["p"] * 3, ["hang", "a", "b"], ["x"] * 3)
        assert not hung_returned.is_set()  # score() returned while the call was still hung
        assert rewards == [0.0, 1.0, 1.0]
        assert stats["reward/n_timeouts"] == 1.0
        assert any("timeout_s=0.5" in r.getMessage() for r in caplog.records)
        rewards, stats = runner.score(["p"], ["c"], ["x"])  # the pool still works
        assert rewards == [1.0] and stats["reward/n_timeouts"] == 0.0
    finally:
        release.set()
        runner.close()


def test_runner_validation_and_close() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        RewardRunner(_constant).score(["a"], [], ["b"])
    with pytest.raises(ValueError, match="extras"):
        RewardRunner(_constant).score(["a"], ["b"], ["c"], [])
    with pytest.raises(ValueError, match="timeout_s"):
        RewardRunner(_constant, timeout_s=0)
    runner = RewardRunner(_constant)
    assert runner.score([], [], []) == (
        [],
        {"reward/n_errors": 0.0, "reward/n_timeouts": 0.0, "reward/n_invalid": 0.0},
    )
    runner.close()
    runner.close()
    with pytest.raises(RuntimeError, match="closed"):
        runner.score(["a"], ["b"], ["c"])
