"""DPO under ``accelerate launch`` with 2 processes (gloo on CPU), DDP and FSDP2: one step on a
fixed batch of pairs of different lengths gives the same loss, metrics, held-out metrics and
weights as 1 process (the pair-mean is global; a pair's two rows never part)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from procs import SUPPORT, check_exit, launch_command, popen

pytestmark = pytest.mark.multiproc

WORKER = str(SUPPORT / "dpo_multiproc_worker.py")


def _data(work: Path) -> Path:
    """8 pairs whose completions have 1 to 15 characters (uneven tokens per rank)."""
    rows = [
        {
            "prompt": f"What is {10 + i} + {20 + i}?",
            "chosen": str(30 + 2 * i) * (1 + i % 5),
            "rejected": f"{31 + 2 * i} maybe" * (1 + i % 2),
        }
        for i in range(8)
    ]
    path = work / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run_pair(tmp_path: Path, two_proc_overrides: list[str], overrides: list[str] = ()):
    data = _data(tmp_path)
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    check_exit(
        [
            popen(
                [sys.executable, WORKER, str(data), str(tmp_path / "r1"), str(one), *overrides],
                tmp_path,
            ),
            popen(
                [
                    *launch_command(2),
                    WORKER,
                    str(data),
                    str(tmp_path / "r2"),
                    str(two),
                    *overrides,
                    *two_proc_overrides,
                ],
                tmp_path,
            ),
        ]
    )
    return torch.load(one, weights_only=False), torch.load(two, weights_only=False)


def _assert_same_step(a: dict, b: dict) -> None:
    assert (a["world"], b["world"]) == (1, 2)
    assert a["stats"]["dpo/n_pairs"] == b["stats"]["dpo/n_pairs"] == 8
    for key in ("dpo/loss", "dpo/grad_norm", "dpo/chosen_logp", "dpo/rejected_logp"):
        assert math.isclose(b["stats"][key], a["stats"][key], rel_tol=1e-5), key
    assert a["stats"]["dpo/loss"] == pytest.approx(math.log(2))  # pi = pi_ref at the step
    assert b["eval"]["eval/n_pairs"] == a["eval"]["eval/n_pairs"] == 7
    for key in ("eval/loss", "eval/margin", "eval/chosen_reward", "eval/accuracy"):
        assert math.isclose(b["eval"][key], a["eval"][key], rel_tol=1e-5, abs_tol=1e-7), key
    assert a["eval"]["eval/margin"] > 0  # the step moved the policy towards the chosen rows
    for name, w in a["state"].items():
        torch.testing.assert_close(b["state"][name], w, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.slow
def test_dpo_step_equal_with_one_and_two_processes_ddp(tmp_path):
    a, b = _run_pair(tmp_path, ["model.mb_spec.n_mbs=2"])
    _assert_same_step(a, b)


@pytest.mark.slow
def test_dpo_step_equal_with_one_process_and_two_fsdp2_shards(tmp_path):
    a, b = _run_pair(tmp_path, ["model.backend=fsdp2"])
    _assert_same_step(a, b)


@pytest.mark.slow
def test_lora_dpo_step_equal_with_one_process_and_two_fsdp2_shards(tmp_path):
    """LoRA under FSDP2, the reference the adapter-disabled model: the merged weights after
    one step equal the unsharded run's."""
    a, b = _run_pair(
        tmp_path,
        ["model.backend=fsdp2"],
        ["model.lora.r=4", "model.lora.save_merged=true"],
    )
    _assert_same_step(a, b)
    for run in ("r1", "r2"):
        final = tmp_path / run / "checkpoints" / "final"
        assert (final / "adapter_config.json").is_file(), run
        assert (tmp_path / run / "recover" / "step_1" / "meta.json").is_file(), run
