"""AReaL's own SFT, DPO and reward-model example files (areal-project/AReaL cbff54d6, vendored
under tests/data/areal/) train 2 steps on builtin:tiny with local data of their
datasets' shape (gsm8k's {question, answer}; hh-rlhf's {chosen, rejected} dialogues) and only
model, data and size overrides, with AReaL's schedule (evaluation and save at the epoch's end,
DPO's cosine LR floor)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from procs import REPO, read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("restore_threads")]

DATA = REPO / "tests" / "data" / "areal"


def _jsonl(path: Path, rows: list[dict[str, str]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _gsm8k_rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        rows.append(
            {
                "question": f"Tom has {a} apples and buys {b} more. How many does he have?",
                "answer": f"He has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}",
            }
        )
    return rows


def _hh_rows(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        head = f"\n\nHuman: What is {a} plus {b}?\n\nAssistant:"
        rows.append({"chosen": f"{head} It is {a + b}.", "rejected": f"{head} I do not know."})
    return rows


def _run(entry: str, rel: str, out: Path, train: str, valid: str) -> list[dict]:
    module = __import__(f"areal_m2po.{entry}", fromlist=["main"])
    status = module.main(
        [
            "--config",
            str(DATA / rel),
            "actor.path=builtin:tiny",
            "actor.backend=fsdp:d1",
            f"train_dataset.path={train}",
            f"valid_dataset.path={valid}",
            "train_dataset.batch_size=4",
            "valid_dataset.batch_size=4",
            f"output_dir={out}",
            "stats_logger.progress_bar=false",
            "stats_logger.console=false",
        ]
    )
    assert status == 0
    return read_metrics(out)


def test_areal_gsm8k_sft_trains_two_steps(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", _gsm8k_rows(8, 0))
    valid = _jsonl(tmp_path / "test.jsonl", _gsm8k_rows(4, 1))
    rows = _run("train_sft", "examples/math/gsm8k_sft.yaml", tmp_path / "out", train, valid)
    # one epoch of 8 examples at 4 per step; AReaL's freq_epochs: 1 evaluates and saves at its end
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["sft/loss"]) for r in rows)
    assert "eval/loss" in rows[1] and "eval/loss" not in rows[0]
    assert rows[0]["sft/lr"] == pytest.approx(1e-5)  # cosine over 2 steps from 2e-5, no floor
    assert (tmp_path / "out" / "checkpoints" / "step_2" / "model.safetensors").is_file()


def test_areals_own_sft_test_config_trains_two_steps(tmp_path):
    """tests/sft/config_fsdp.yaml, AReaL's own SFT test config: 8 examples at 4 per step make
    its one epoch (total_train_epochs: 1, before its total_train_steps: 16) 2 steps."""
    train = _jsonl(tmp_path / "train.jsonl", _gsm8k_rows(8, 0))
    valid = _jsonl(tmp_path / "test.jsonl", _gsm8k_rows(4, 1))
    rows = _run("train_sft", "tests/sft/config_fsdp.yaml", tmp_path / "out", train, valid)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["sft/loss"]) for r in rows)


def test_areal_hhrlhf_dpo_trains_two_steps(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", _hh_rows(8, 0))
    valid = _jsonl(tmp_path / "test.jsonl", _hh_rows(4, 1))
    rows = _run("train_dpo", "examples/alignment/hhrlhf_dpo.yaml", tmp_path / "out", train, valid)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["dpo/loss"]) for r in rows)
    assert "eval/accuracy" in rows[1]
    # AReaL's cosine with min_lr_ratio 0.1 over 2 steps (warm-up round(0.2) = 0): the LR after
    # step 1 is 5e-6 * (0.1 + 0.9 * 0.5), after step 2 the floor 5e-7
    assert [r["dpo/lr"] for r in rows] == pytest.approx([2.75e-6, 5e-7])
    assert (tmp_path / "out" / "checkpoints" / "step_2" / "model.safetensors").is_file()


def test_areal_hhrlhf_rw_trains_two_steps(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", _hh_rows(8, 0))
    valid = _jsonl(tmp_path / "test.jsonl", _hh_rows(4, 1))
    rows = _run("train_rm", "examples/alignment/hhrlhf_rw.yaml", tmp_path / "out", train, valid)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["train/loss"]) for r in rows)
    assert "eval/accuracy" in rows[1]
    assert (tmp_path / "out" / "checkpoints" / "step_2" / "model.safetensors").is_file()
