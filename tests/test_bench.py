"""scripts/bench.py runs end to end at a toy size and prints its figures (no timing asserted)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


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
    for name in ("overhead_ratio", "m2po_fraction_of_update", "logprob_peak_mem_ratio", "mfu"):
        assert float(figures[name]) >= 0, name
    assert figures["rl_step_breakdown"].startswith("gen:")
    # the chunked log-probs never hold a full fp32 log-softmax: well under the 3x of one
    assert float(figures["logprob_peak_mem_ratio@vocab512"]) <= 1.5
