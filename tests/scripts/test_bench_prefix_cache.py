"""scripts/bench/bench_prefix_cache.py on the tiny model: every arm runs, the grouping by
common prefix leaves the tokens and log-probs as they were, and the threshold sweep runs."""

from __future__ import annotations

import math

from script_loader import load_script

SMALL = ["--model", "builtin:tiny", "--rounds", "1", "--eval-prompts", "4", "--prompts", "2"]


def test_bench_prefix_cache_tiny() -> None:
    bench = load_script("scripts/bench/bench_prefix_cache.py")
    figures = bench.main([*SMALL, "--n-samples", "2", "--system-tokens", "40"])
    for name in ("eval_on/off", "gen_on/off", "nograd_on/off", "gen_sys", "nograd_sys"):
        assert math.isfinite(figures[name]) and figures[name] > 0, name
    # the arms computed the same things: same tokens, log-probs within rounding
    assert figures["eval_same_tokens"] == 1.0 and figures["gen_same_tokens"] == 1.0
    assert figures["nograd_max_abs_dlogp"] < 1e-4


def test_bench_prefix_cache_threshold_tiny() -> None:
    bench = load_script("scripts/bench/bench_prefix_cache.py")
    figures = bench.main([*SMALL, "--threshold", "--heads", "2,8", "--ks", "2"])
    assert set(figures) == {"k2_L2_split/whole", "k2_L8_split/whole"}
    assert all(math.isfinite(v) and v > 0 for v in figures.values())
