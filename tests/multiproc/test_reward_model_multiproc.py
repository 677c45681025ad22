"""The learned reward and train_rm under ``accelerate launch`` with 2 processes (gloo on CPU):
each rank scores its own rows, normalisation and metrics are global, and one reward-model
step gives the same weights as with 1 process."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from procs import SUPPORT, check_exit, launch_command, popen

pytestmark = pytest.mark.multiproc


def _prepare(work: Path) -> None:
    from areal_m2po.reward.reward_model import load_reward_model, load_reward_tokenizer

    tok = load_reward_tokenizer("builtin:tiny")
    torch.manual_seed(0)
    model = load_reward_model("builtin:tiny", "float32", "sdpa", tok.pad_token_id)
    model.save_pretrained(work / "rm")
    torch.save(model.state_dict(), work / "initial.pt")
    tok.save_pretrained(work / "rm")
    rows = [
        {"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": f"{2 * i} maybe"}
        for i in range(10, 18)
    ]
    (work / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_learned_reward_and_rm_step_equal_with_one_and_two_processes(tmp_path):
    _prepare(tmp_path)
    worker = str(SUPPORT / "rm_multiproc_worker.py")
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    check_exit(
        [
            popen([sys.executable, worker, str(tmp_path), str(one)], tmp_path),
            popen([*launch_command(2), worker, str(tmp_path), str(two)], tmp_path),
        ]
    )
    a = torch.load(one, weights_only=False)
    b = torch.load(two, weights_only=False)
    assert (a["world"], b["world"]) == (1, 2)
    # batch normalisation over all ranks: 2 x 3 rows give the rewards of 1 x 6 rows
    torch.testing.assert_close(b["rewards"], a["rewards"], rtol=1e-5, atol=1e-5)
    for key, value in a["stats"].items():
        assert math.isclose(b["stats"][key], value, rel_tol=1e-5, abs_tol=1e-6), key
    for key in ("train/loss", "train/accuracy", "train/margin", "train/grad_norm"):
        assert math.isclose(b["train_stats"][key], a["train_stats"][key], rel_tol=1e-4), key
    assert b["train_stats"]["train/n_pairs"] == 8
    for name, w in a["state"].items():
        torch.testing.assert_close(b["state"][name], w, rtol=1e-4, atol=1e-6, msg=name)
    initial = torch.load(tmp_path / "initial.pt", weights_only=True)
    moved = max(float((w - initial[k]).abs().max()) for k, w in a["state"].items())
    assert moved > 1e-4  # the step changed the weights
