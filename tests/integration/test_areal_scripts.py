"""AReaL's Python API on this trainer (issue 56): AReaL's own gsm8k_rl.py (vendored unchanged
from areal-project/AReaL cbff54d6 under tests/data/areal/examples/math/) runs 2 steps through
``python -m areal_m2po.areal.run`` on builtin:tiny with only model, data, size and step
overrides; and a user's AReaL-style workflow returning AReaL's tensor dict trains through
``PPOTrainer`` with its per-token versions in the batch."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from procs import REPO, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("restore_threads")]

EXAMPLES = REPO / "tests" / "data" / "areal" / "examples"
MATH = EXAMPLES / "math"


def _gsm8k_folder(root: Path) -> Path:
    """A local copy of openai/gsm8k as the Hub repository lays it out (main/<split>-*.parquet),
    with short questions of gsm8k's shape."""
    import pandas as pd

    for split, n, seed in (("train", 8, 0), ("test", 4, 1)):
        rng = random.Random(seed)
        rows = []
        for _ in range(n):
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            rows.append({"question": f"{a}+{b}=?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"})
        (root / "gsm8k" / "main").mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(root / "gsm8k" / "main" / f"{split}-00000-of-00001.parquet")
    return root / "gsm8k"


def _hh_folder(root: Path) -> Path:
    """A local copy of Anthropic/hh-rlhf as the Hub repository lays it out
    (<subset>/<split>.jsonl.gz), with short dialogues of its shape."""
    import gzip
    import json

    (root / "hh-rlhf" / "harmless-base").mkdir(parents=True)
    for split, n, seed in (("train", 8, 0), ("test", 4, 1)):
        rng = random.Random(seed)
        with gzip.open(root / "hh-rlhf" / "harmless-base" / f"{split}.jsonl.gz", "wt") as fh:
            for _ in range(n):
                a, b = rng.randint(2, 9), rng.randint(2, 9)
                head = f"\n\nHuman: What is {a} plus {b}?\n\nAssistant:"
                row = {"chosen": f"{head} It is {a + b}.", "rejected": f"{head} I do not know."}
                fh.write(json.dumps(row) + "\n")
    return root / "hh-rlhf"


def _supervised(data: Path) -> list[str]:
    """The model, data and size overrides of the SFT, DPO and RW scripts."""
    return [
        "actor.path=builtin:tiny",
        "actor.backend=fsdp:d1",
        f"train_dataset.path={data}",
        f"valid_dataset.path={data}",
        "train_dataset.batch_size=4",
        "valid_dataset.batch_size=4",
    ]


SIZE = [
    "actor.path=builtin:tiny",
    "actor.backend=fsdp:d1",
    "rollout.backend=sglang:d1",
    "train_dataset.batch_size=4",
    "valid_dataset.batch_size=4",
    "gconfig.n_samples=2",
    "gconfig.max_new_tokens=8",
    "gconfig.max_tokens=136",
    "train_dataset.max_length=100",
    "total_train_steps=2",
]
"""Model, size and step overrides (AReaL's keys); the data path is added per test."""


def _run_script(tmp_path: Path, script: str, config: str, overrides: list[str]) -> None:
    """``python -m areal_m2po.areal.run`` of AReaL's ``script`` with ``--config config`` and
    ``overrides``, from ``tmp_path`` (its runs write under ``tmp_path/outputs``)."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable, "-m", "areal_m2po.areal.run", str(EXAMPLES / script),
        "--config", str(EXAMPLES / config), *overrides,
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def test_areal_gsm8k_rl_script_runs_unchanged(tmp_path):
    data = _gsm8k_folder(tmp_path)
    paths = [f"train_dataset.path={data}", f"valid_dataset.path={data}"]
    _run_script(tmp_path, "math/gsm8k_rl.py", "math/gsm8k_grpo.yaml", [*paths, *SIZE])
    run_dir = tmp_path / "outputs" / "gsm8k-grpo" / "trial0"  # experiment/trial names
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) for r in rows)
    # MathAgent through the agent endpoint: 4 prompts x n_samples 2 per step
    assert (
        all(r["rollout/n_samples"] == 8 for r in rows) if "rollout/n_samples" in rows[0] else True
    )
    # AReaL's evaluator and saver (freq_epochs: 1) at the end of the 2-step epoch
    assert "eval/accuracy" in rows[1] and "eval/accuracy" not in rows[0]
    assert (run_dir / "checkpoints" / "step_2").is_dir()


def test_custom_areal_workflow_trains_and_its_versions_reach_the_batch(tmp_path):
    from areal_m2po.areal import PPOTrainer, workflow_context
    from areal_m2po.areal.api import ModelRequest, RolloutWorkflow
    from areal_m2po.areal.api.cli_args import GRPOConfig, load_expr_config
    from areal_m2po.areal.utils import stats_tracker

    rewards: list[float] = []

    class OneBehindWorkflow(RolloutWorkflow):
        """AReaL's contract; it marks every generated token one version older than the
        engine says, so the batch's staleness is exactly 1, and scores a completion by its
        mean negative log-prob (distinct rewards: non-zero advantages)."""

        def __init__(self, gconfig, tokenizer):  # type: ignore[no-untyped-def]
            self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer)
            self.tokenizer = tokenizer

        async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
            ids = self.tokenizer.encode(data["question"])
            req = ModelRequest(uuid.uuid4().hex, ids, self.gconfig.new(n_samples=1))
            resp = await engine.agenerate(req)
            p, c = resp.input_len, resp.output_len
            reward = -sum(resp.output_logprobs) / c
            rewards.append(reward)
            stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward)
            row = {
                "input_ids": torch.tensor(resp.input_tokens + resp.output_tokens),
                "loss_mask": torch.tensor([0] * p + [1] * c),
                "logprobs": torch.tensor([0.0] * p + resp.output_logprobs),
                "versions": torch.tensor([-1] * p + [v - 1 for v in resp.output_versions]),
                "attention_mask": torch.ones(p + c, dtype=torch.bool),
                "rewards": torch.tensor(reward),
            }
            return {k: v.unsqueeze(0) for k, v in row.items()}

    config, _ = load_expr_config(
        [
            "actor.path=builtin:tiny",
            f"output_dir={tmp_path / 'run'}",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=6",
            "total_train_steps=2",
            "actor.m2_threshold=0.04",
            "rollout.staleness=0",
            "num_threads=1",
            "stats_logger.progress_bar=false",
        ],
        GRPOConfig,
    )
    rows = [{"question": f"{a}+{a}=?", "answer": str(2 * a)} for a in range(2, 6)]
    with PPOTrainer(config, train_dataset=rows) as trainer:
        from areal_m2po.areal.utils.hf_utils import load_hf_tokenizer

        tok = load_hf_tokenizer("builtin:tiny")
        trainer.train(workflow=OneBehindWorkflow(config.gconfig, tok))
    metrics = read_metrics(tmp_path / "run")
    assert [r["step"] for r in metrics] == [1, 2]
    # the workflow's versions, not the engine's: one behind the actor's at each step
    assert [r["rollout/staleness"] for r in metrics] == [1.0, 1.0]
    assert [r["rollout/version_min"] for r in metrics] == [-1.0, 0.0]
    # the rewards the workflow returned, 4 per step, and stats_tracker's record of them
    assert len(rewards) == 8
    means = [sum(rewards[:4]) / 4, sum(rewards[4:]) / 4]
    assert [r["reward/mean"] for r in metrics] == pytest.approx(means, rel=1e-5)
    assert [r["areal/rollout/reward"] for r in metrics] == pytest.approx(means, rel=1e-5)
    assert all(r["actor/grad_norm"] > 0 for r in metrics)  # it trains
    assert not any(k.startswith("eval/") for r in metrics for k in r)  # no valid_dataset


def test_areal_gsm8k_sft_script_runs_unchanged(tmp_path):
    """gsm8k_sft.py: AReaL's SFTTrainer on get_custom_dataset's tokenized gsm8k rows; 8
    examples at 4 per step are its one epoch, evaluated and saved at its end (freq_epochs: 1)."""
    data = _gsm8k_folder(tmp_path)
    _run_script(tmp_path, "math/gsm8k_sft.py", "math/gsm8k_sft.yaml", _supervised(data))
    run_dir = tmp_path / "outputs" / "gsm8k-sft" / "trial0"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["sft/loss"]) for r in rows)
    assert "eval/loss" in rows[1] and "eval/loss" not in rows[0]
    assert (run_dir / "checkpoints" / "step_2").is_dir()


@pytest.mark.parametrize(
    ("script", "loss"), [("hhrlhf_dpo", "dpo/loss"), ("hhrlhf_rw", "train/loss")]
)
def test_areal_hhrlhf_scripts_run_unchanged(tmp_path, script, loss):
    """hhrlhf_dpo.py and hhrlhf_rw.py: AReaL's DPOTrainer and RWTrainer on get_custom_dataset's
    tokenized hh-rlhf pairs; one epoch of 2 steps, evaluated and saved at its end."""
    data = _hh_folder(tmp_path)
    _run_script(tmp_path, f"alignment/{script}.py", f"alignment/{script}.yaml", _supervised(data))
    run_dir = tmp_path / "outputs" / script.replace("_", "-") / "trial0"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r[loss]) for r in rows)
    assert "eval/accuracy" in rows[1] and "eval/accuracy" not in rows[0]
    assert (run_dir / "checkpoints" / "step_2").is_dir()


def test_areal_countdown_script_runs_unchanged(tmp_path):
    """examples/countdown/train.py, copied with reward_score.py and train_config.yaml (unchanged)
    into a folder laid out as AReaL's repository, run from its root: its own RolloutWorkflow
    named by a dotted path into examples.*, its sibling import, its json data set and its
    stats_tracker reward; no valid_dataset, so no evaluation (AReaL's rule)."""
    import json
    import shutil

    project = tmp_path / "project"
    (project / "examples" / "countdown").mkdir(parents=True)
    for name in ("train.py", "reward_score.py", "train_config.yaml"):
        shutil.copy(EXAMPLES / "countdown" / name, project / "examples" / "countdown" / name)
    rng = random.Random(0)
    (project / "data").mkdir()
    with open(project / "data" / "train.jsonl", "w") as fh:
        for _ in range(8):
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            row = {"query": f"Use {[a, b]} to make {a + b}.", "target": a + b, "numbers": [a, b]}
            fh.write(json.dumps(row) + "\n")
    overrides = [
        "train_dataset.path=data/train.jsonl",
        "valid_dataset.path=data/train.jsonl",
        *[o for o in SIZE if not o.startswith("valid_dataset")],
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "areal_m2po.areal.run", "examples/countdown/train.py",
        "--config", "examples/countdown/train_config.yaml", *overrides,
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(project / "outputs" / "countdown-grpo" / "trial0")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) for r in rows)
    # the workflow's stats_tracker reward is the batch's reward
    assert [r["areal/rollout/reward"] for r in rows] == pytest.approx(
        [r["reward/mean"] for r in rows]
    )
    assert not any(k.startswith("eval/") for r in rows for k in r)


def test_rlvr_workflow_by_areal_paths_trains_and_evaluates(tmp_path):
    """The issue's call: PPOTrainer(...).train(workflow="areal.workflow.rlvr.RLVRWorkflow",
    ...) with AReaL's reward by AReaL's path and an eval_workflow, without the runner; the
    evaluator (AReaL's rule: valid_dataset and eval_workflow given) runs at the end."""
    from areal_m2po.areal import PPOTrainer
    from areal_m2po.areal.api.cli_args import GRPOConfig, load_expr_config
    from areal_m2po.areal.dataset import get_custom_dataset
    from areal_m2po.areal.utils.hf_utils import load_hf_tokenizer

    data = _gsm8k_folder(tmp_path)
    config, _ = load_expr_config(
        [
            "actor.path=builtin:tiny",
            f"output_dir={tmp_path / 'run'}",
            f"train_dataset.path={data}",
            f"valid_dataset.path={data}",
            "train_dataset.batch_size=4",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=6",
            "total_train_steps=2",
            "evaluator.eval_at_start=false",
            "num_threads=1",
            "stats_logger.progress_bar=false",
        ],
        GRPOConfig,
    )
    tok = load_hf_tokenizer(config.tokenizer_path)
    train = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tok)
    valid = get_custom_dataset(split="test", dataset_config=config.valid_dataset, tokenizer=tok)
    kwargs = {
        "reward_fn": "areal.reward.gsm8k.gsm8k_reward_fn",
        "gconfig": config.gconfig,
        "tokenizer": config.tokenizer_path,
    }
    with PPOTrainer(config, train_dataset=train, valid_dataset=valid) as trainer:
        trainer.train(
            workflow="areal.workflow.rlvr.RLVRWorkflow",
            workflow_kwargs=kwargs,
            eval_workflow="areal.workflow.rlvr.RLVRWorkflow",
            eval_workflow_kwargs=kwargs,
        )
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) for r in rows)
    assert [r["areal/rollout/reward"] for r in rows] == pytest.approx(
        [r["reward/mean"] for r in rows]
    )
    assert "eval/reward" in rows[1] and "eval/accuracy" in rows[1]
    assert 0.0 <= rows[1]["eval/reward"] <= 1.0
