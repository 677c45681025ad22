"""The RL step with and without each exact shortcut, side by side in one process: two
``RLTrainer`` of one config, stepped in turn (interleaved rounds, one thread count).

Shortcuts measured (``--shortcut``):

* ``share``: sync HF rollout generates from the trainer's own module instead of a copy
  (``RLTrainer.share_rollout_policy``): no second copy of the weights, a weight sync that only
  sets the version. Exact: both trainers must log the very same statistics.
* ``shared_prefix``: each distinct prompt run once in the proximal pass
  (``actor.mb_spec.shared_prefix``) and in the update (``shared_prefix_train``), against both
  off. Equal up to float rounding: the largest difference of any statistic is printed.

Run::

    python scripts/bench/bench_step_shortcuts.py                       # the main job, 3 rounds
    python scripts/bench/bench_step_shortcuts.py --shortcut shared_prefix --threads 2
    python scripts/bench/bench_step_shortcuts.py --config configs/tiny.yaml --rounds 2

Each round steps the trainer without the shortcut, then the one with it (the order alternates
from round to round); an exact shortcut must log the very same statistics (every value but
timings), which the benchmark checks. It prints per-round step and sync-phase seconds, the medians of the
per-round ratios (with / without), and the bytes of weights the rollout engine holds apart
from the policy. The last lines are ``name=value``. Extra ``key=value`` arguments override
the config (evaluation and saves are off).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, also under runpy
try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib.harness import QUIET_RUN, Clock, PhaseTimer, setup_process  # noqa: E402

from areal_m2po.api.config_loader import load_config  # noqa: E402


def arm_overrides(shortcut: str, on: bool) -> list[str]:
    """The config overrides of one arm (``on``: with the shortcut)."""
    if shortcut == "shared_prefix":
        flag = str(on).lower()
        return [f"actor.mb_spec.shared_prefix={flag}", f"actor.mb_spec.shared_prefix_train={flag}"]
    return []


def build(args: argparse.Namespace, on: bool, timer: PhaseTimer) -> Any:
    """An ``RLTrainer`` of ``args.config`` with the shortcut on or off, evaluation off."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    class Trainer(RLTrainer):
        share_rollout_policy = on if args.shortcut == "share" else True

    cfg = load_config(
        [
            "--config",
            args.config,
            f"output_dir={tempfile.mkdtemp(prefix='bench-shortcuts-')}",
            f"total_train_steps={args.rounds + 1}",
            f"num_threads={args.threads}",
            *QUIET_RUN,
            *args.overrides,
            *arm_overrides(args.shortcut, on),
        ]
    )
    trainer = Trainer(cfg, callbacks=[timer])
    trainer.rollout.start(trainer.actor_engine.full_tensors, trainer.actor_engine.version)
    while trainer.rollout.prefill_needed():
        trainer.rollout.prefill_one()
    return trainer


def separate_bytes(trainer: Any) -> int:
    """Bytes of weights the rollout engine holds that are not the policy's own tensors."""
    policy = {p.data_ptr() for p in trainer.actor_engine.unwrapped.parameters()}
    model = trainer.rollout.engine.generator.model
    return sum(
        t.numel() * t.element_size() for t in model.parameters() if t.data_ptr() not in policy
    )


def one_step(trainer: Any, clock: Clock, timer: PhaseTimer) -> tuple[float, float, dict]:
    """Seconds of one step (generation included) and of its sync phase, and its statistics
    without timings."""
    timer.seconds = 0.0
    t0 = clock.now()
    batch, info = trainer.rollout.next_batch()
    stats = trainer._train_step(batch, info)
    trainer.step += 1
    seconds = clock.now() - t0
    return seconds, timer.seconds, {k: v for k, v in stats.items() if "timing" not in k}


def stats_gap(a: dict, b: dict) -> float:
    """The largest difference between two steps' statistics, relative for values above 1 and
    absolute below (a loss near 0 has no meaningful relative error); inf: other keys."""
    if a.keys() != b.keys():
        return float("inf")
    gap = 0.0
    for key, x in a.items():
        y = b[key]
        if x != y:
            gap = max(gap, abs(x - y) / max(abs(x), abs(y), 1.0))
    return gap


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[2] / "configs/default.yaml")
    )
    ap.add_argument("--shortcut", choices=("share", "shared_prefix"), default="share")
    ap.add_argument("--rounds", type=int, default=3, help="steps per arm")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = ap.parse_args(argv)
    setup_process(args.threads, "no")
    import torch

    clock = Clock(torch.device("cpu"), args.clock)
    timers = {share: PhaseTimer(clock, ["sync"]) for share in (False, True)}
    trainers = {share: build(args, share, timers[share]) for share in (False, True)}
    held = {share: separate_bytes(t) for share, t in trainers.items()}
    rows: list[tuple[float, float, float, float]] = []
    gaps: list[float] = []
    try:
        for r in range(args.rounds):
            out: dict[bool, tuple[float, float, dict]] = {}
            for share in (False, True) if r % 2 == 0 else (True, False):
                out[share] = one_step(trainers[share], clock, timers[share])
            gap = stats_gap(out[False][2], out[True][2])
            if args.shortcut == "share" and gap != 0.0:
                raise SystemExit(f"round {r + 1}: the statistics differ with the shortcut")
            gaps.append(gap)
            rows.append((out[False][0], out[True][0], out[False][1], out[True][1]))
            print(
                f"round {r + 1}: step {rows[-1][0]:.2f} -> {rows[-1][1]:.2f} s, "
                f"sync {rows[-1][2]:.3f} -> {rows[-1][3]:.3f} s ({clock.kind}), "
                f"largest stat difference {gap:.2e}",
                flush=True,
            )
    finally:
        for t in trainers.values():
            t.close()
    name = args.shortcut
    figures = {
        f"{name}_step_ratio": statistics.median(b / a for a, b, _, _ in rows),
        f"{name}_sync_ratio": statistics.median(d / max(c, 1e-9) for _, _, c, d in rows),
        "without_step_s": statistics.median(a for a, _, _, _ in rows),
        "without_sync_s": statistics.median(c for _, _, c, _ in rows),
        "without_held_gb": held[False] / 1e9,
        "with_held_gb": held[True] / 1e9,
        "largest_stat_gap": max(gaps),
    }
    for name, value in figures.items():
        print(f"{name}={value:.6g}")
    return figures


if __name__ == "__main__":
    main()
