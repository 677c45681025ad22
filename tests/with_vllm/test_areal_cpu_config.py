"""AReaL's own CPU example, ``gsm8k_grpo_cpu.yaml`` (tests/data/areal), trains here for 2 steps
with only the model and dataset paths overridden: its ``rollout.backend: "vllm:d1p1t1"`` (one
vLLM server, asynchronous rollout with max_head_offpolicyness 2), ``actor.backend:
"fsdp:d1p1t1"`` (one process), bfloat16, its decoupled loss with rejection sampling, its
per-epoch evaluation, save and checkpoint cadence.

The model is the vLLM tests' tiny Llama (builtin:tiny's head size 16 is not one vLLM's CPU
attention runs); the dataset 32 GSM8K-style records (2 steps of 16 prompts) and 4 held-out
ones, written here.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from procs import REPO, read_metrics, subprocess_env
from vllm_helpers import write_tiny_vllm_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CPU_FILE = REPO / "tests" / "data" / "areal" / "examples" / "math" / "gsm8k_grpo_cpu.yaml"


def write_gsm8k_style(path: Path, n: int, seed: int) -> Path:
    """``n`` GSM8K-format records (``question``, ``answer`` ending in ``#### <number>``)."""
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for _ in range(n):
            a, b = rng.randint(2, 40), rng.randint(2, 40)
            record = {
                "question": f"Sam has {a} marbles and finds {b} more. How many marbles now?",
                "answer": f"{a} + {b} = {a + b}\n#### {a + b}",
            }
            fh.write(json.dumps(record) + "\n")
    return path


def areal_cpu_command(model: str, train: Path, valid: Path) -> list[str]:
    """The run: AReaL's file, the model and the two dataset paths."""
    return [
        sys.executable,
        "-m",
        "areal_m2po.train",
        "--config",
        str(CPU_FILE),
        f"actor.path={model}",
        f"train_dataset.path={train}",
        f"valid_dataset.path={valid}",
    ]


def test_areal_cpu_example_trains_two_steps(tmp_path):
    # the file's vllm.max_model_len is 2048: the model must take that context
    model = write_tiny_vllm_model(str(tmp_path / "model"), max_position_embeddings=2048)
    train = write_gsm8k_style(tmp_path / "train.jsonl", 32, seed=1)
    valid = write_gsm8k_style(tmp_path / "valid.jsonl", 4, seed=2)
    proc = subprocess.run(
        areal_cpu_command(model, train, valid),
        cwd=tmp_path,  # the file's run names give output_dir outputs/gsm8k-grpo-cpu/trial0
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("warning: AReaL config")]
    assert len(warnings) == 1
    run = tmp_path / "outputs" / "gsm8k-grpo-cpu" / "trial0"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
        assert r["actor/version"] - r["rollout/version_min"] <= 2  # max_head_offpolicyness
    assert "eval/accuracy" in rows[-1]  # evaluator.freq_epochs: 1, one epoch of 2 steps
    assert os.listdir(run / "checkpoints") == ["step_2"]  # saver.freq_epochs: 1
    saved = json.loads((run / "checkpoints" / "step_2" / "config.json").read_text())
    assert saved["torch_dtype" if "torch_dtype" in saved else "dtype"] == "bfloat16"
