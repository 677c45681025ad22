"""Training runs with the multi-turn and agent workflows on the tiny model, in both modes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_m2po.api.config_loader import load_config

REPO = Path(__file__).resolve().parents[2]
MULTI_TURN = [
    "rollout.workflow=areal_m2po.rollout.workflows.multi_turn.workflow:MultiTurnWorkflow",
    # digit_fraction > 0 counts as right: a random model gets both retries and successes
    "rollout.workflow_kwargs={environment: retry, max_turns: 3, turn_discount: 0.5}",
]
AGENT = [
    "rollout.workflow=areal_m2po.rollout.workflows.agent.workflow:AgentWorkflow",
    "rollout.workflow_kwargs={agent: 'toy_agents:two_turn_agent'}",
]


def _args(run_dir: Path, *extra: str) -> list[str]:
    return [
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        f"output_dir={run_dir}",
        "total_train_steps=2",
        "gconfig.max_new_tokens=6",
        "saver.save_at_end=false",
        "evaluator.eval_at_end=false",
        "reward.path=toy_rewards:digit_fraction",
        "num_threads=1",
        *extra,
    ]


def _metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _train_in_process(run_dir: Path, *extra: str) -> list[dict]:
    from areal_m2po.trainer.rl_trainer import run

    assert run(load_config(_args(run_dir, *extra))) == 0
    return _metrics(run_dir)


EVAL_AT_END = "evaluator.eval_at_end=true"


def _check_multi_turn_rows(rows: list[dict]) -> None:
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["actor/loss"]) and "m2po/masked_fraction" in r
        assert r["multi_turn/episodes"] == 16  # 4 prompts x 4 samples
        assert r["multi_turn/episodes"] <= r["multi_turn/turns"] <= 3 * r["multi_turn/episodes"]
    assert sum(r["multi_turn/multi_turn_episodes"] for r in rows) > 0  # retries happened
    # the held-out evaluation ran greedy retry episodes (16 records), not single completions
    last = rows[-1]
    assert last["eval/n"] == 16 and 0.0 <= last["eval/accuracy"] <= 1.0
    assert 1.0 <= last["eval/turns_mean"] <= 3.0 and last["eval/tool_use_fraction"] == 0.0
    # a retry episode takes a second turn exactly when its first answer was wrong
    assert last["eval/second_turn_fraction"] >= 1.0 - last["eval/accuracy"] - 1e-9


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        # one step stale, decoupled loss, M2PO: behaviour, proximal and current policies differ
        ["rollout.staleness=1", "actor.use_decoupled_loss=true", "actor.m2_threshold=0.04"],
        [
            "rollout.staleness=0",
            "critic.enabled=true",
            "critic.path=builtin:tiny",
            "actor.adv_norm.mean_level=batch",
        ],
    ],
    ids=["stale-decoupled-m2po", "critic"],
)
def test_multi_turn_training_sync(tmp_path: Path, extra: list[str]) -> None:
    rows = _train_in_process(tmp_path / "run", *MULTI_TURN, *extra, EVAL_AT_END)
    _check_multi_turn_rows(rows)
    if "critic.enabled=true" in extra:
        assert all(math.isfinite(r["critic/value_loss"]) for r in rows)
    else:
        assert rows[1]["rollout/version_max"] == 0  # step 2 trained on step 1's policy


ASYNC = [
    "rollout.mode=async",
    "rollout.staleness=0",
    "rollout.max_head_offpolicyness=1",
    "rollout.server_threads=1",
]


def _train_in_subprocess(run_dir: Path, *extra: str) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "support")]))
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", *_args(run_dir, *extra)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=500,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _metrics(run_dir)


@pytest.mark.slow
def test_multi_turn_training_async(tmp_path: Path) -> None:
    rows = _train_in_subprocess(tmp_path / "run", *MULTI_TURN, *ASYNC, EVAL_AT_END)
    _check_multi_turn_rows(rows)
    for r in rows:  # the staleness bound, counted over every token's version
        assert r["actor/version"] - r["rollout/version_min"] <= 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_agent_workflow_training(tmp_path: Path, mode: str) -> None:
    if mode == "sync":
        rows = _train_in_subprocess(tmp_path / "run", *AGENT, "rollout.staleness=1", EVAL_AT_END)
    else:
        rows = _train_in_subprocess(tmp_path / "run", *AGENT, *ASYNC, EVAL_AT_END)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["agent/calls"] == 32 and r["agent/untrained_calls"] == 0  # 16 episodes x 2
        assert math.isfinite(r["actor/loss"])
    # held-out: one greedy agent episode per record, two calls each
    assert rows[-1]["eval/n"] == 16 and rows[-1]["eval/calls_mean"] == 2.0
    assert 0.0 <= rows[-1]["eval/reward_mean"] <= 1.0
