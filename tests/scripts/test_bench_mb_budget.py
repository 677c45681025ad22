"""scripts/bench/bench_mb_budget.py on the tiny config (slow: a few seconds of training)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]


def _load():
    return load_script("scripts/bench/bench_mb_budget.py")


@pytest.mark.slow
def test_bench_mb_budget_tiny(capsys):
    bench = _load()
    config = str(ROOT / "configs" / "tiny.yaml")
    out = bench.main(["--config", config, "--budgets", "64,none", "--repeats", "1"])
    printed = dict(
        line.split("=", 1) for line in capsys.readouterr().out.splitlines() if "=" in line
    )
    for key in ("step_time_ratio@64", "update_time_ratio@64", "update_peak_ratio@64"):
        assert math.isfinite(float(printed[key])) and float(printed[key]) > 0
    assert out["none"]["step_time_ratio"] == 1.0 and out["none"]["micro_batches"] == 1
    # 16 rows of more than 64 padded tokens: a budget of 64 puts every row in its own
    # micro-batch, and the update then holds one row's activations instead of sixteen
    # (allocator events)
    assert out["64"]["micro_batches"] == out["rows"] == 16
    assert out["64"]["update_peak_ratio"] < 0.5
