"""scripts/bench/bench.py runs end to end at a toy size and prints its figures (no timing asserted)."""

from __future__ import annotations

import math
import re
import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench" / "bench.py"


def test_bench_smoke(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    import torch

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    threads = torch.get_num_threads()
    names = ("", "areal_m2po", "transformers", "accelerate", "bench")
    levels = {n: logging.getLogger(n).level for n in names}
    root_handlers = list(logging.getLogger().handlers)
    bench = runpy.run_path(str(BENCH), run_name="bench")
    try:
        rc = bench["main"](
            [
                "--sizes=1m",
                "--repeats=1",
                "--rl-steps=3",
                "--prompts=2",
                "--samples=2",
                "--max-new-tokens=6",
                "--mem-rows=1024",
                "--mem-vocab=512",
                "--device=cpu",
            ]
        )
    finally:
        torch.set_num_threads(threads)
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)
        logging.getLogger().handlers[:] = root_handlers
    assert rc == 0
    out = capsys.readouterr().out
    figures = dict(re.findall(r"^([a-z_0-9@]+)=(\S+)$", out, flags=re.M))
    # timings were taken: a ratio of two measured times is finite and positive
    for name in ("overhead_ratio@1m", "packed_speedup@1m"):
        assert 0 < float(figures[name]) < math.inf, name
    # the default (packed) update over the bare step is the ratio of the two printed ratios
    default_vs_bare = float(figures["overhead_ratio@1m"]) / float(figures["packed_speedup@1m"])
    assert float(figures["default_update_vs_bare@1m"]) == pytest.approx(default_vs_bare, abs=2e-3)
    # M2PO's share is part of the update time: the timer caught its calls, and not more
    assert 0 < float(figures["m2po_fraction_of_update@1m"]) < 1
    # model FLOP utilisation against a matmul probe of the same run: above 1 would mean the
    # update's FLOPs are over-counted
    for name in ("mfu@1m", "mfu_padded@1m"):
        assert 0 < float(figures[name]) < 1, name
    # the RL step breakdown: every stage the config turns on ran and took time, and the
    # completion throughput counts the generated tokens
    parts = dict(p.split(":") for p in figures["rl_step_breakdown"].split(","))
    for stage in ("gen", "logprob", "ref", "update"):
        assert float(parts[stage].rstrip("%")) > 0, stage
    assert sum(float(parts[k].rstrip("%")) for k in ("gen", "logprob", "ref", "update")) <= 100.5
    assert float(parts["completion_tok_per_s"]) > 0
    # the chunked log-probs never hold a full fp32 log-softmax: well under the 3x of one
    assert float(figures["logprob_peak_mem_ratio@vocab512"]) <= 1.5
