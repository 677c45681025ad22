"""The policy's no-grad log-prob pass (the proximal recompute) on one real main-job batch, with
each micro-batch budget and with and without shared prompts, side by side in one process.

Run::

    python scripts/bench/bench_forward_pass.py                 # the main job, 2 threads
    python scripts/bench/bench_forward_pass.py --config configs/tiny.yaml --threads 1

It builds one ``RLTrainer`` of the config (evaluation off), draws one batch from its rollout
(generation included, once), then times ``PPOActor.compute_logp`` on that batch under every
setting of ``actor.mb_spec.shared_prefix`` and budget (``max_tokens_per_mb`` for the plain pass,
``shared_prefix_max_tokens_per_mb`` for the shared one) in interleaved rounds. Per setting it
prints the median seconds, the median of the per-round ratios against the baseline (the plain
pass at the config's ``max_tokens_per_mb``, the trainer's pass before ``shared_prefix``) and the
largest difference of its log-probs from the baseline's. The last lines are ``name=value``.
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

from benchlib.harness import (  # noqa: E402
    QUIET_RUN,
    Clock,
    interleaved,
    median_ratio,
    setup_process,
)

from areal_m2po.api.config_loader import load_config  # noqa: E402

BUDGETS = (256, 512, 1024, 2048, None)


def build(args: argparse.Namespace) -> Any:
    """An ``RLTrainer`` of ``args.config``, evaluation and logs off, its rollout started."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = load_config(
        [
            "--config",
            args.config,
            f"output_dir={tempfile.mkdtemp(prefix='bench-forward-')}",
            f"num_threads={args.threads}",
            *QUIET_RUN,
            *args.overrides,
        ]
    )
    trainer = RLTrainer(cfg)
    trainer.rollout.start(trainer.actor_engine.full_tensors, trainer.actor_engine.version)
    return trainer


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[2] / "configs/default.yaml")
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = ap.parse_args(argv)
    setup_process(args.threads, "no")
    import torch

    trainer = build(args)
    try:
        batch, _ = trainer.rollout.next_batch()
        spec = trainer.actor_engine.config.mb_spec
        base_budget = spec.max_tokens_per_mb
        settings = [(False, base_budget)] + [
            (shared, b)
            for shared in (False, True)
            for b in BUDGETS
            if (shared, b) != (False, base_budget)
        ]
        results: dict[str, torch.Tensor] = {}

        def arm(shared: bool, budget: int | None) -> Any:
            name = f"{'shared' if shared else 'plain'}@{budget}"

            def run() -> None:
                # a plain pass takes max_tokens_per_mb, a shared one its own budget
                spec.shared_prefix = shared
                spec.max_tokens_per_mb = base_budget if shared else budget
                spec.shared_prefix_max_tokens_per_mb = budget
                results[name] = trainer.actor.compute_logp(dict(batch))

            return name, run

        fns = dict(arm(s, b) for s, b in settings)
        clock = Clock(torch.device("cpu"), args.clock)
        times = interleaved(fns, args.rounds, clock)
    finally:
        trainer.close()
    base = next(iter(fns))
    mask = batch["loss_mask"]
    rows, groups = int(mask.shape[0]), int(mask.shape[0]) // trainer.config.gconfig.n_samples
    print(f"batch: {rows} rows, {groups} groups, {int(mask.sum())} scored tokens, {clock.kind} s")
    figures: dict[str, float] = {}
    for name, secs in times.items():
        ratio = median_ratio(secs, times[base])
        diff = float((results[name] - results[base])[mask].abs().max())
        print(
            f"{name:>14}: {statistics.median(secs):7.3f} s  ratio {ratio:.3f}  max|dlogp| {diff:.2e}"
        )
        figures[f"{name}_ratio"] = ratio
    for key, value in figures.items():
        print(f"{key}={value:.4f}")
    return figures


if __name__ == "__main__":
    main()
