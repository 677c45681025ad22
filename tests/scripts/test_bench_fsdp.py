"""scripts/bench/bench_fsdp.py at a toy size: the figures parse and the state is halved by sharding."""

from __future__ import annotations

import math

import pytest
from script_loader import load_script

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def _load():
    return load_script("scripts/bench/bench_fsdp.py")


def test_bench_fsdp_toy(capsys):
    bench = _load()
    out = bench.main(["--hidden", "64", "--layers", "2", "--vocab", "512", "--seq", "16"])
    printed = dict(
        line.split("=", 1) for line in capsys.readouterr().out.splitlines() if "=" in line
    )
    for key in ("fsdp_state_bytes_ratio", "fsdp_peak_mem_ratio", "fsdp_step_time_ratio"):
        assert key in printed and math.isfinite(float(printed[key])) and out[key] > 0
    # every tensor of the state is split in two halves (dim 0 even): exactly half per rank
    assert out["fsdp_state_bytes_ratio"] == pytest.approx(0.5, abs=0.01)
    assert out["ddp_state_mib"] > out["fsdp_state_mib"] > 0


def test_figures_take_the_worst_rank():
    bench = _load()
    ddp = [{"state_bytes": 100, "peak_above_base": 10, "step_s": 1.0}] * 2
    sharded = [
        {"state_bytes": 50, "peak_above_base": 6, "step_s": 1.0},
        {"state_bytes": 52, "peak_above_base": 4, "step_s": 3.0},
    ]
    out = bench.figures(ddp, sharded)
    assert out["fsdp_state_bytes_ratio"] == pytest.approx(0.52)
    assert out["fsdp_peak_mem_ratio"] == pytest.approx(0.6)
    assert out["fsdp_step_time_ratio"] == pytest.approx(3.0)
