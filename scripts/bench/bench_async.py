"""Async vs sync rollout on this machine: step time ratio, overlap, and the separate-device model.

Run::

    python scripts/bench/bench_async.py                      # the main job's shape, 4 steps per mode
    python scripts/bench/bench_async.py --tiny --steps 3     # seconds: configs/tiny.yaml

It trains the same job for ``--steps`` steps in sync mode (``num_threads`` = trainer + server
threads, or ``--sync-threads``) and in async mode with one rollout server (``--trainer-threads`` for the trainer,
``--server-threads`` for the server), both on-policy-bounded as the main job is
(``max_head_offpolicyness`` = 1 in async, ``staleness`` = 1 in sync), and prints, as
``name=value`` lines:

* ``sync_step_s``, ``async_step_s``: mean ``timing/step_s`` of the steps after the first;
* ``async_vs_sync_step_time``: ``async_step_s / sync_step_s`` (< 1: async is faster);
* ``overlap_fraction``: in the async run, the share of wall time (first step start to last
  step end) in which a sample was in flight on a server while the trainer was training;
* ``sync_generation_share``: ``g``, generation's share of a sync step (``timing/gen_s`` over
  ``timing/step_s``), and ``modelled_speedup_separate_devices`` = ``1 / max(g, 1 - g)``: the step
  time ratio sync/async when generation and training run on separate devices and overlap
  fully (``1 / (1 - g)`` while ``g <= 1/2``).

On one shared CPU both modes compete for the same cores, so ``async_vs_sync_step_time`` there
says little about separate devices; the model line is what carries over (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def overlap_seconds(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total length of the intersection of two unions of intervals (each ``(start, end)``)."""

    def union(xs: list[tuple[float, float]]) -> list[tuple[float, float]]:
        out: list[list[float]] = []
        for s, e in sorted(x for x in xs if x[1] > x[0]):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        return [(s, e) for s, e in out]

    ua, ub = union(a), union(b)
    i = j = 0
    total = 0.0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        total += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def _run(overrides: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Train with ``overrides``; returns the metrics rows and the recorded intervals."""
    from areal_m2po.api import PPOConfig, load_config
    from areal_m2po.trainer.rl_trainer import RLTrainer

    class TimedTrainer(RLTrainer):
        """Records when each training step (after its batch arrived) ran."""

        train_intervals: list[tuple[float, float]] = []

        def _train_step(self, batch: Any, info: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return super()._train_step(batch, info)
            finally:
                self.train_intervals.append((t0, time.perf_counter()))

    cfg = load_config(overrides, PPOConfig)
    trainer = TimedTrainer(cfg)
    trainer.train_intervals = []
    try:
        trainer.train()
        gen = list(getattr(trainer.rollout, "busy_intervals", []))
    finally:
        trainer.close()
    with open(os.path.join(cfg.output_dir, "metrics.jsonl")) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return rows, {"train": trainer.train_intervals, "gen": gen}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--tiny", action="store_true", help="configs/tiny.yaml instead of the demo")
    p.add_argument("--trainer-threads", type=int, default=1)
    p.add_argument("--server-threads", type=int, default=1)
    p.add_argument(
        "--sync-threads",
        type=int,
        default=None,
        help="threads of the sync run (default: trainer + server threads, the same budget)",
    )
    p.add_argument("overrides", nargs="*", help="extra config overrides for both runs")
    args = p.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    base = ["--config", os.path.join(REPO, "configs", "tiny.yaml")] if args.tiny else []
    base += [
        f"total_train_steps={args.steps}",
        "evaluator.eval_at_start=false",
        "evaluator.eval_at_end=false",
        "evaluator.freq_steps=null",
        "saver.save_at_end=false",
        "stats_logger.progress_bar=false",
        *args.overrides,
    ]
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        sync_rows, _ = _run(
            base
            + [
                f"output_dir={tmp}/sync",
                "rollout.mode=sync",
                "rollout.staleness=1",
                f"num_threads={args.sync_threads or args.trainer_threads + args.server_threads}",
            ]
        )
        async_rows, iv = _run(
            base
            + [
                f"output_dir={tmp}/async",
                "rollout.mode=async",
                "rollout.staleness=0",
                "rollout.max_head_offpolicyness=1",
                f"rollout.server_threads={args.server_threads}",
                f"num_threads={args.trainer_threads}",
            ]
        )
    sync_steps = [r["timing/step_s"] for r in sync_rows[1:]]
    async_steps = [r["timing/step_s"] for r in async_rows[1:]]
    out["sync_step_s"] = statistics.mean(sync_steps)
    out["async_step_s"] = statistics.mean(async_steps)
    out["async_vs_sync_step_time"] = out["async_step_s"] / out["sync_step_s"]
    wall = iv["train"][-1][1] - iv["train"][0][0]
    out["overlap_fraction"] = overlap_seconds(iv["gen"], iv["train"]) / wall if wall > 0 else 0.0
    g = statistics.mean(r["timing/gen_s"] / r["timing/step_s"] for r in sync_rows[1:])
    out["sync_generation_share"] = g
    out["modelled_speedup_separate_devices"] = 1.0 / max(g, 1.0 - g)
    for k, v in out.items():
        print(f"{k}={v:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
