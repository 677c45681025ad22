"""scripts/bench/bench_prefix_cache.py on the tiny model: every arm runs, the grouping by
common prefix leaves the tokens and log-probs as they were, and the threshold sweep runs."""

from __future__ import annotations

import math

from script_loader import load_script

SMALL = ["--model", "builtin:tiny", "--rounds", "1", "--eval-prompts", "4", "--prompts", "2"]


def test_bench_prefix_cache_tiny() -> None:
    bench = load_script("scripts/bench/bench_prefix_cache.py")
    figures = bench.main([*SMALL, "--n-samples", "2", "--system-tokens", "40"])
    for kind in ("eval", "gen", "nograd"):
        for name in (f"{kind}_on/off", f"{kind}_dyn/off", f"{kind}_on/dyn"):
            assert math.isfinite(figures[name]) and figures[name] > 0, name
    for name in ("eval_hf/off", "gen_on/hf", "gen_sys_on", "gen_sys_hf", "nograd_sys_on"):
        assert math.isfinite(figures[name]) and figures[name] > 0, name
    # the arms computed the same things: same tokens, log-probs within rounding
    for mode in ("on", "hf", "dyn"):
        assert figures[f"eval_{mode}_same_tokens"] == 1.0, mode
    for mode in ("hf", "dyn"):  # HF generate, one random stream
        assert figures[f"gen_{mode}_same_tokens"] == 1.0, mode
    assert figures["gen_on_max_abs_dlogp_vs_forward"] < 1e-4  # the own loop, its own stream
    for mode in ("on", "dyn"):
        assert figures[f"nograd_{mode}_max_abs_dlogp"] < 1e-4, mode


def test_bench_prefix_cache_some_arms() -> None:
    """``--arms``: only the arms the regex finds run, and only their ratios are given."""
    bench = load_script("scripts/bench/bench_prefix_cache.py")
    figures = bench.main([*SMALL, "--n-samples", "2", "--system-tokens", "40", "--arms", "nograd"])
    assert {"nograd_on/off", "nograd_sys_on", "nograd_on_max_abs_dlogp"} <= set(figures)
    assert not any(k.startswith(("eval", "gen")) for k in figures)


def test_bench_prefix_cache_threshold_tiny() -> None:
    bench = load_script("scripts/bench/bench_prefix_cache.py")
    figures = bench.main([*SMALL, "--threshold", "--heads", "2,8", "--ks", "2"])
    assert set(figures) == {"k2_L2_split/whole", "k2_L8_split/whole"}
    assert all(math.isfinite(v) and v > 0 for v in figures.values())
