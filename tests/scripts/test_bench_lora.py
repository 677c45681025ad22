"""scripts/bench_lora.py: the figures by hand, and (slow) a run on the tiny shape."""

from __future__ import annotations

import math

import pytest
from script_loader import load_script


def _load():
    return load_script("scripts/bench/bench_lora.py")


def test_figures_by_hand():
    bench = _load()
    full = {"state_bytes": 400, "peak_above_base": 100, "step_s": 2.0, "n_params": 100}
    lora = {"state_bytes": 8, "peak_above_base": 40, "step_s": 1.0, "n_trainable": 2}
    out = bench.figures(full, lora)
    assert out["lora_state_bytes_ratio"] == pytest.approx(0.02)
    assert out["lora_peak_mem_ratio"] == pytest.approx(0.4)
    assert out["lora_step_time_ratio"] == pytest.approx(0.5)
    assert out["lora_trainable_fraction"] == pytest.approx(0.02)


@pytest.mark.slow
def test_bench_lora_tiny(capsys):
    bench = _load()
    out = bench.main(["--shape", "tiny", "--rank", "2", "--seq", "16", "--steps", "1"])
    printed = dict(
        line.split("=", 1) for line in capsys.readouterr().out.splitlines() if "=" in line
    )
    for key in ("lora_state_bytes_ratio", "lora_peak_mem_ratio", "lora_step_time_ratio"):
        assert key in printed and math.isfinite(float(printed[key])) and out[key] > 0
    # AdamW: parameters, gradients and two moments, 4 float32 copies of what trains, both ways
    # parameters + gradients + AdamW moments scale with the trainable count; AdamW's per-tensor
    # `step` scalars (one per parameter tensor, many small ones with LoRA) add a little on top
    assert out["lora_state_bytes_ratio"] >= out["lora_trainable_fraction"]
    assert out["lora_state_bytes_ratio"] == pytest.approx(out["lora_trainable_fraction"], rel=0.01)
    assert out["lora_state_bytes_ratio"] < 0.5
