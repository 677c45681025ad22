"""Plot on-policy distillation against RL from the task reward, from two runs' metrics.jsonl:

    python scripts/plot_distillation.py RL_RUN_DIR DISTILL_RUN_DIR --out docs/figures/distillation.png

Three panels against the training step: held-out greedy accuracy (``eval/accuracy``, with its
standard error when logged) of both runs, their mean training reward (``reward/mean``), and the
distillation run's sampled reverse KL to its teacher (``distill/reverse_kl``, nats per policy
token). Reads the runs with :mod:`areal_m2po.plot`'s helpers; ``--max-step`` cuts both curves at
a step (the RL run may be longer: it is also the teacher).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from areal_m2po.plot import read_metrics, series


def _records(run_dir: str, max_step: int | None) -> list[dict[str, Any]]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} does not exist (is {run_dir} a run directory?)")
    records = read_metrics(path)
    return [r for r in records if max_step is None or r["step"] <= max_step]


def build_figure(runs: list[tuple[str, list[dict[str, Any]]]]) -> Any:
    """A matplotlib Figure: accuracy, reward and reverse KL of each ``(label, records)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    panels = (
        ("held-out greedy accuracy (128 problems)", "eval/accuracy", ""),
        ("training reward (mean over samples)", "reward/mean", ""),
        ("sampled reverse KL to the teacher", "distill/reverse_kl", "nats / policy token"),
    )
    for ax, (title, key, ylabel) in zip(axes, panels):
        for label, records in runs:
            xs, ys = series(records, key)
            if not xs:
                continue
            ax.plot(xs, ys, marker="o", ms=3, label=label)
            _, se = series(records, "eval/accuracy_se")
            if key == "eval/accuracy" and len(se) == len(ys):
                lo = [y - s for y, s in zip(ys, se)]
                hi = [y + s for y, s in zip(ys, se)]
                ax.fill_between(xs, lo, hi, alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if ylabel:
            ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rl_run", help="run directory of RL from the task reward")
    parser.add_argument("distill_run", help="run directory of on-policy distillation")
    parser.add_argument("--out", default="distillation.png", help="PNG path")
    parser.add_argument("--max-step", type=int, default=None, help="last step drawn")
    args = parser.parse_args(argv)
    try:
        runs = [
            ("RL, task reward (configs/default.yaml)", _records(args.rl_run, args.max_step)),
            ("distillation (configs/distill.yaml)", _records(args.distill_run, args.max_step)),
        ]
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import matplotlib.pyplot as plt

    fig = build_figure(runs)
    fig.savefig(args.out, dpi=100)
    plt.close(fig)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
