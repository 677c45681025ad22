"""Reward functions of both signatures (this trainer's and AReaL's), and the ones no call can
work with: refused in one line when ``reward.path`` loads; failures counted, the first
traceback shown once, and a step whose every sample failed stops the run."""

from __future__ import annotations

import functools
import logging

import pytest
import torch

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.reward import RewardRunner, load_reward_fn
from areal_m2po.reward.signature import AREAL, OURS, check_reward_fn
from areal_m2po.trainer.rollout_stats import RewardFunctionFailed, check_rewards_usable


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        (
            "toy_rewards:async_reward",
            r"^reward\.path: 'toy_rewards:async_reward': async_reward.*"
            r"is an async function.*plain 'def'$",
        ),
        (
            "toy_rewards:two_args",
            r"^reward\.path: 'toy_rewards:two_args': "
            r"two_args\(prompt: str, completion: str\) -> float cannot take a reward call",
        ),
    ],
    ids=["async-def", "two-args"],
)
def test_unusable_reward_fn_refused_at_load(spec: str, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as info:
        load_reward_fn(spec, "reward.path")
    assert "\n" not in str(info.value)


def test_async_callables_of_every_form_refused() -> None:
    async def fn(prompt, completion, answer):
        return 1.0

    class Scorer:
        async def __call__(self, prompt, completion, answer):
            return 1.0

    for candidate in (fn, functools.partial(fn), Scorer()):
        with pytest.raises(ConfigError, match="async function"):
            check_reward_fn(candidate)


@pytest.mark.parametrize(
    ("fn", "style"),
    [
        (lambda prompt, completion, answer: 0.0, OURS),
        (lambda prompt, completion, answer, **kw: 0.0, OURS),
        (lambda *args, **kw: 0.0, OURS),
        (lambda prompt, completions, prompt_ids, completion_ids, answer, **kw: 0.0, AREAL),
        (lambda prompt, completions, prompt_ids, completion_ids, **kw: 0.0, AREAL),
        (lambda p, c, pi, ci, answer: 0.0, AREAL),  # ``answer`` fifth, where AReaL has it
        (lambda prompt, completions, *args, **kw: 0.0, AREAL),  # AReaL's name
        (lambda prompt, completion, answer, level: 0.0, OURS),  # a field by name
    ],
)
def test_style_detection(fn, style: str) -> None:
    assert check_reward_fn(fn).style == style


@pytest.mark.parametrize(
    "fn",
    [
        lambda prompt, completion: 0.0,
        lambda: 0.0,
        lambda prompt, completions, prompt_ids: 0.0,  # AReaL's names, one id list short
        lambda prompt, completions, answer=None, **kw: 0.0,  # AReaL's name, 3 positionals
    ],
)
def test_wrong_signatures_refused(fn) -> None:
    with pytest.raises(ConfigError, match=r"^reward\.path: .*cannot take a reward call"):
        check_reward_fn(fn)


def test_areal_fn_gets_text_ids_and_record_fields_as_areal_passes_them() -> None:
    """AReaL's workflow: ``fn(prompt, completion, prompt_ids, completion_ids, **record)``."""
    calls = []

    def fn(prompt, completions, prompt_ids, completion_ids, answer, **kwargs):
        calls.append((prompt, completions, prompt_ids, completion_ids, answer, kwargs))
        return float(len(completion_ids))

    with RewardRunner(fn) as runner:
        rewards, stats = runner.score(
            ["P"], ["done"], ["42"], [{"question": "q?", "level": 3}], [[1, 2]], [[7, 8, 9]]
        )
    assert rewards == [3.0] and stats["reward/n_errors"] == 0
    assert calls == [("P", "done", [1, 2], [7, 8, 9], "42", {"question": "q?", "level": 3})]


def test_areal_fn_without_kwargs_gets_only_its_named_fields() -> None:
    def fn(prompt, completions, prompt_ids, completion_ids, answer, level):
        return float(level) + float(answer)

    with RewardRunner(fn) as runner:
        rewards, _ = runner.score(
            ["P"], ["c"], ["2"], [{"question": "q", "level": 3}], [[1]], [[2]]
        )
    assert rewards == [5.0]


def test_our_fn_keeps_its_call() -> None:
    seen = []

    def fn(prompt, completion, answer, level):
        seen.append((prompt, completion, answer, level))
        return 1.0

    with RewardRunner(fn) as runner:
        rewards, _ = runner.score(
            ["P"], ["c"], ["a"], [{"question": "q", "level": 3}], [[1]], [[2]]
        )
    assert rewards == [1.0] and seen == [("P", "c", "a", 3)]


def test_raising_fn_first_traceback_once_every_error_counted(caplog) -> None:
    def fn(prompt, completion, answer):
        raise ZeroDivisionError(f"bad {completion}")

    level = caplog.at_level(logging.WARNING, logger="areal_m2po.reward")
    with level, RewardRunner(fn, name="mod:fn") as runner:
        _, first = runner.score(["p"] * 3, ["x"] * 3, ["a"] * 3)
        _, second = runner.score(["p"] * 2, ["x"] * 2, ["a"] * 2)
    assert first["reward/n_errors"] == 3 and second["reward/n_errors"] == 2
    tracebacks = [r.getMessage() for r in caplog.records if "Traceback" in r.getMessage()]
    assert len(tracebacks) == 1
    assert "mod:fn raised ZeroDivisionError: bad x" in tracebacks[0]
    assert 'raise ZeroDivisionError(f"bad {completion}")' in tracebacks[0]  # the user's line
    assert len(caplog.records) == 1  # the same message is not repeated
    assert runner.last_problem == "raised ZeroDivisionError: bad x"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("toy_rewards:returns_nan", "returned float nan"),
        ("toy_rewards:returns_none", "returned NoneType None"),
        ("toy_rewards:returns_string", "returned str '1.0'"),
    ],
)
def test_invalid_values_counted(spec: str, problem: str) -> None:
    with RewardRunner(load_reward_fn(spec)) as runner:
        rewards, stats = runner.score(["p"] * 2, ["c"] * 2, ["a"] * 2)
    assert rewards == [0.0, 0.0] and stats["reward/n_invalid"] == 2
    assert runner.last_problem.startswith(problem)


class _Runner:
    last_problem = "raised KeyError: 'solution'"


def _batch(n: int) -> dict[str, torch.Tensor]:
    return {"rewards": torch.zeros(n)}


def test_every_sample_failed_stops_the_run_in_one_line() -> None:
    stats = {"reward/n_errors": 3.0, "reward/n_invalid": 1.0, "reward/n_timeouts": 0.0}
    with pytest.raises(RewardFunctionFailed) as info:
        check_rewards_usable(stats, _batch(4), "mod:fn", _Runner())
    line = str(info.value)
    assert "\n" not in line and info.value.exit_status == 1
    assert line.startswith("reward.path='mod:fn' failed on every sample of the step (4 of 4")
    assert "raised KeyError: 'solution'" in line and "first traceback" in line
    invalid = {"reward/n_errors": 0.0, "reward/n_invalid": 4.0}
    with pytest.raises(RewardFunctionFailed, match="must return a finite int or float"):
        check_rewards_usable(invalid, _batch(4), "mod:fn", _Runner())


@pytest.mark.parametrize(
    "stats",
    [
        {"reward/n_errors": 3.0, "reward/n_invalid": 0.0},  # one sample scored
        {"reward/n_errors": 0.0, "reward/n_invalid": 0.0, "reward/n_timeouts": 4.0},  # slow
        {},  # a workflow that grades on its own
    ],
)
def test_steps_with_a_score_or_only_timeouts_go_on(stats) -> None:
    check_rewards_usable(stats, _batch(4), "mod:fn", _Runner())  # no error


def test_areal_gsm8k_reward_fn_scores_through_reward_path() -> None:
    """AReaL's GSM8K reward (math_verify) named by ``reward.path`` scores what it scores in
    AReaL: 1 for an equal answer in any form math_verify reads, 0 otherwise."""
    fn = load_reward_fn("areal_m2po.areal.reward:gsm8k_reward_fn")
    completions = [
        "She sold 48 + 24 = 72 clips. \\boxed{72}",
        "The answer is 72",
        "The answer is 71",
        "",
    ]
    with RewardRunner(fn, timeout_s=60) as runner:
        rewards, stats = runner.score(
            ["q"] * 4, completions, ["72"] * 4, None, [[1]] * 4, [[2]] * 4
        )
    assert runner.call.style == AREAL
    assert rewards == [1.0, 1.0, 0.0, 0.0] and stats["reward/n_errors"] == 0
    with RewardRunner(fn, timeout_s=60) as runner:
        assert runner.score(["q"], ["It is 0.5"], ["1/2"])[0] == [1.0]  # symbolic equality
