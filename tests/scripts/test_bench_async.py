"""scripts/bench/bench_async.py: the interval arithmetic by hand, and a tiny end-to-end smoke run
(figures parse; no timing asserted)."""

from __future__ import annotations

import math
import re
import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench_async.py"


@pytest.fixture(scope="module")
def bench():
    return runpy.run_path(str(BENCH), run_name="bench_async")


def test_overlap_seconds_by_hand(bench):
    overlap = bench["overlap_seconds"]
    # generation busy [0, 2] and [3, 5]; training [1, 4] -> overlap [1, 2] + [3, 4] = 2
    assert overlap([(0, 2), (3, 5)], [(1, 4)]) == 2
    # overlapping intervals inside one list count once
    assert overlap([(0, 3), (1, 2)], [(0, 10)]) == 3
    assert overlap([(0, 1)], [(1, 2)]) == 0  # touching is not overlapping
    assert overlap([], [(0, 1)]) == 0
    assert overlap([(5, 4)], [(0, 10)]) == 0  # empty/negative intervals ignored


@pytest.mark.slow
def test_bench_async_smoke(bench, capsys, monkeypatch):
    assert bench["main"](["--tiny", "--steps", "2"]) == 0
    lines = dict(re.findall(r"^(\w+)=([-\d.e+]+)$", capsys.readouterr().out, re.M))
    for name in (
        "sync_step_s",
        "async_step_s",
        "async_vs_sync_step_time",
        "overlap_fraction",
        "sync_generation_share",
        "modelled_speedup_separate_devices",
    ):
        assert math.isfinite(float(lines[name])), name
    assert 0 <= float(lines["overlap_fraction"]) <= 1
    g = float(lines["sync_generation_share"])
    assert float(lines["modelled_speedup_separate_devices"]) == pytest.approx(
        1 / max(g, 1 - g), abs=1e-3
    )
