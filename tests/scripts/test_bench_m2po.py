"""scripts/bench/bench_m2po.py runs at a toy size; its regimes mask what they claim (no timing
asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench_m2po.py"


def test_bench_m2po_smoke() -> None:
    args = ["--rows=16", "--cols=64", "--plain-rows=8", "--plain-cols=64"]
    args += ["--update-rows=2", "--update-cols=16", "--repeats=1"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = dict(
        line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line and "#" not in line
    )
    values = {k: float(v) for k, v in figures.items()}
    assert values["masked_fraction@quiet"] == 0.0
    assert 0.0 < values["masked_fraction@stale"] < 0.5
    # the threshold is the float64 mean of the smallest 80%: about 20% masked
    assert abs(values["masked_fraction@on_mean"] - 0.2) < 0.05
    update_ms = values["update_ms_per_1k_tokens"] * 16 * 64 / 1e3
    assert abs(values["update_ms_lower_bound"] - update_ms) <= 1e-3 * update_ms
    for regime in ("quiet", "stale", "on_mean"):
        assert values[f"vs_plain@{regime}"] > 0 and values[f"stats_vs_plain@{regime}"] > 0
        mask_ms = values[f"mask_ms@{regime}"]
        share = mask_ms / (mask_ms + values["update_ms_lower_bound"])
        assert abs(values[f"m2po_share@{regime}"] - share) <= 1e-3 * share
