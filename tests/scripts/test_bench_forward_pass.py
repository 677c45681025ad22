"""scripts/bench/bench_forward_pass.py and bench_step_shortcuts.py's shared-prefix arm on the
tiny config (slow: a tiny run's rollout and steps)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.mark.slow
def test_bench_forward_pass_tiny(capsys):
    bench = load_script("scripts/bench/bench_forward_pass.py")
    figures = bench.main(["--config", TINY, "--rounds", "1", "--threads", "1"])
    printed = capsys.readouterr().out
    assert figures["plain@256_ratio"] == 1.0  # the baseline against itself
    for name in ("shared@1024", "shared@None", "plain@None"):
        assert math.isfinite(figures[f"{name}_ratio"]) and figures[f"{name}_ratio"] > 0
    # every setting scored the same tokens: the shared pass within rounding of the plain one
    for line in printed.splitlines():
        if "max|dlogp|" in line:
            assert float(line.split()[-1]) < 1e-4, line


@pytest.mark.slow
def test_bench_step_shortcuts_shared_prefix_tiny(capsys):
    bench = load_script("scripts/bench/bench_step_shortcuts.py")
    figures = bench.main(["--config", TINY, "--shortcut", "shared_prefix", "--rounds", "2"])
    assert figures["shared_prefix_step_ratio"] > 0
    # equal up to rounding: the two trainers' statistics stay close
    assert figures["largest_stat_gap"] < 1e-2
