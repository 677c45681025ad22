"""examples/rlhf_reward_model.py: pairs from the policy's samples -> reward model -> PPO on the
learned reward alone, at tiny size; and its pair-building and reward-gap helpers by hand."""

from __future__ import annotations

import contextlib
import io
import random
import runpy
from pathlib import Path

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rlhf_reward_model.py"


@pytest.fixture(scope="module")
def ex():
    return runpy.run_path(str(EXAMPLE), run_name="example_rlhf")


def test_make_pairs_pairs_better_with_worse_distinct_texts(ex):
    pairs = ex["make_pairs"](
        "What is 2 + 3?",
        ["5", "5", "6", "", "five", "6"],
        [1.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        10,
        random.Random(0),
    )
    # distinct non-empty texts: 5 (right), 6 and five (wrong): 2 pairs, both chosen "5"
    assert sorted((p["chosen"], p["rejected"]) for p in pairs) == [("5", "6"), ("5", "five")]
    assert all(p["prompt"] == "What is 2 + 3?" for p in pairs)
    capped = ex["make_pairs"]("q", ["a", "b", "c", "d"], [3.0, 2.0, 1.0, 0.0], 2, random.Random(0))
    assert len(capped) == 2  # 6 ordered pairs exist, capped at 2
    assert ex["make_pairs"]("q", ["a", "b"], [1.0, 1.0], 5, random.Random(0)) == []


def test_reward_gap_by_hand(ex):
    rows = [
        {"learned": 0.0, "learned_std": 2.0, "true": 0.10, "corr": 0.5},
        {"learned": 1.0, "learned_std": 2.0, "true": 0.10, "corr": 0.4},
        {"learned": 4.0, "learned_std": 1.0, "true": 0.15, "corr": 0.1},
    ]
    gap = ex["reward_gap"](rows, window=1)
    assert gap["learned_gain_in_std"] == pytest.approx((4.0 - 0.0) / 2.0)
    assert gap["true_gain_points"] == pytest.approx(5.0)
    assert (gap["corr_first"], gap["corr_last"]) == (0.5, 0.1)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The output directory the tiny runs below share (a rerun reuses finished stages)."""
    return tmp_path_factory.mktemp("rlhf_tiny")


@pytest.fixture(scope="module")
def tiny_run(ex, tiny_dir) -> tuple[dict, str]:
    """The tiny run's three stages in ``tiny_dir``, run once for the module, whichever test
    asks first (each test of this module passes alone): its summary and printed output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = ex["main"](["--tiny", "--output-dir", str(tiny_dir)])
    return summary, out.getvalue()


def test_tiny_run_goes_through_all_three_stages(tiny_run, tiny_dir):
    tmp_path = tiny_dir
    summary, out = tiny_run
    assert "[0/3] SFT" in out
    assert "[1/3] pairs:" in out and "[2/3] reward model" in out and "[3/3] PPO" in out
    sft = summary["sft"]
    assert sft["steps"] == 3 and sft["eval_loss"] < sft["eval_loss_before"]
    assert summary["args"]["policy"] == sft["path"] == summary["args"]["rm_base"]
    assert (Path(sft["path"]) / "model.safetensors").is_file()
    pairs = summary["pairs"]
    assert pairs["train_pairs"] > 0 and pairs["valid_pairs"] > 0
    assert (tmp_path / "pairs" / "train.jsonl").is_file()
    rm = summary["reward_model"]
    assert 0.0 <= rm["eval_accuracy"] <= 1.0 and rm["eval_pairs"] == pairs["valid_pairs"]
    assert (Path(rm["path"]) / "model.safetensors").is_file()
    ppo = summary["ppo"]
    assert [s for s, _ in ppo["true_accuracy"]] == [0, 1, 2]
    assert [r["step"] for r in ppo["per_step"]] == [1, 2]
    # the PPO run trained on the learned reward alone
    cfg = yaml.safe_load((tmp_path / "ppo" / "config.yaml").read_text())
    assert cfg["reward"]["model"]["path"] == rm["path"]
    assert cfg["reward"]["model"]["verifiable_weight"] == 0.0
    assert cfg["actor"]["path"] == sft["path"]  # PPO starts from (and stays near) the SFT model
    assert (tmp_path / "summary.json").is_file()


def test_tiny_dpo_arms_on_the_same_pairs(ex, tiny_run, tiny_dir, capsys):
    """--dpo on a finished run (``tiny_run``, whichever test ran it): the earlier stages are
    read back, not run again; each DPO arm
    trains the SFT model on the reward model's pairs and is measured by the PPO run's own
    evaluation (the SFT model reads as PPO's step 0)."""
    plot = tiny_dir / "comparison.png"
    argv = ["--tiny", "--output-dir", str(tiny_dir), "--dpo", "--dpo-lr", "1e-3", "1e-4"]
    summary = ex["main"]([*argv, "--plot", str(plot)])
    out = capsys.readouterr().out
    sft, ppo = summary["sft"], summary["ppo"]
    assert [a["name"] for a in summary["dpo"]] == ["dpo", "dpo_lr0.0001"]  # 1e-3: the RM's lr
    for arm in summary["dpo"]:
        cfg = yaml.safe_load((tiny_dir / arm["name"] / "config.yaml").read_text())
        assert cfg["model"]["path"] == sft["path"]  # DPO starts from the SFT model ...
        assert cfg["model"]["optimizer"]["lr"] == arm["lr"]
        assert cfg["train_dataset"]["path"] == str(tiny_dir / "pairs" / "train.jsonl")  # RM's
        assert cfg["valid_dataset"]["path"] == str(tiny_dir / "pairs" / "valid.jsonl")
        assert arm["eval_pairs"] == summary["pairs"]["valid_pairs"]
        held = arm["held_out_pairs"]
        assert held[0]["step"] == 0 and held[0]["eval/accuracy"] == 0.0  # pi = pi_ref: ties
        assert [s for s, _ in arm["true_accuracy"]] == [0, arm["half"], arm["steps"]]
        assert arm["true_accuracy"][0][1] == ppo["true_accuracy"][0][1]  # one measurement
        assert [r[0] for r in arm["train_logps"]] == list(range(1, arm["steps"] + 1))
        assert (Path(arm["path"]) / "model.safetensors").is_file()
    assert out.count("[DPO] SFT -> DPO") == 2 and plot.is_file()
    assert "sft: finished in an earlier run" in out and "ppo: finished in an earlier run" in out
    again = ex["main"](argv)  # every stage finished: read back
    assert again["dpo"] == summary["dpo"]
