"""A reward function that can never work, through the real entry point
(``python -m areal_m2po.train`` on the tiny model): refused in one line when ``reward.path``
loads (status 2), or stopped in one line at the first step whose every sample failed
(status 1, nothing saved); an AReaL reward function trains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from procs import REPO, read_metrics, subprocess_env

TINY_RL = str(REPO / "configs" / "tiny.yaml")


def _train(out: Path, reward: str) -> subprocess.CompletedProcess:
    args = [
        "--config",
        TINY_RL,
        f"output_dir={out}",
        "num_threads=1",
        "total_train_steps=2",
        "evaluator.eval_at_end=false",
        f"reward.path={reward}",
    ]
    return subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", *args],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize(
    ("reward", "problem"),
    [
        ("toy_rewards:always_raises", "raised RuntimeError: reward function failure for testing"),
        ("toy_rewards:returns_nan", "returned float nan"),
        ("toy_rewards:returns_string", "returned str '1.0'"),
    ],
    ids=["raises", "nan", "string"],
)
def test_reward_failing_on_every_sample_stops_the_run(tmp_path: Path, reward: str, problem: str):
    out = tmp_path / "run"
    proc = _train(out, reward)
    assert proc.returncode == 1, proc.stderr[-3000:]
    (line,) = _error_lines(proc)
    assert line.startswith(f"error: reward.path={reward!r} failed on every sample of the step")
    assert problem in line
    assert not (out / "checkpoints").exists()  # no "trained" model
    assert not (out / "metrics.jsonl").exists() or read_metrics(out) == []
    if "raised" in problem:  # the user's traceback, once
        assert proc.stderr.count("Traceback (most recent call last)") == 1


@pytest.mark.parametrize(
    ("reward", "what"),
    [("toy_rewards:async_reward", "is an async function"), ("toy_rewards:two_args", "cannot take")],
    ids=["async-def", "two-args"],
)
def test_unusable_reward_fn_refused_before_models_load(tmp_path: Path, reward: str, what: str):
    proc = _train(tmp_path / "run", reward)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = _error_lines(proc)
    assert line.startswith(f"error: reward.path: {reward!r}: ") and what in line
    assert "Loading" not in proc.stderr and "step 1" not in proc.stderr


def test_areal_reward_fn_trains(tmp_path: Path):
    """AReaL's signature gets the token ids: every reward is 1 + the digit share, in [1, 2]."""
    out = tmp_path / "run"
    proc = _train(out, "toy_rewards:areal_digit_count")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["reward/n_errors"] == 0 and r["reward/n_invalid"] == 0
        assert 1.0 <= r["reward/mean"] <= 2.0


def test_areal_gsm8k_reward_path_as_areal_writes_it_trains(tmp_path: Path):
    """``reward.path`` as AReaL's example configs write it: this package's copy of AReaL's
    math_verify reward loads (AReaL is not installed) and scores without errors."""
    out = tmp_path / "run"
    proc = _train(out, "areal.reward.gsm8k.gsm8k_reward_fn")
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["reward/n_errors"] == 0 and r["reward/n_invalid"] == 0 for r in records)
    assert all(0.0 <= r["reward/mean"] <= 1.0 for r in records)
