"""The study's figure: accuracy, masked/clipped fraction and behaviour KL per update."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from .arms import Arm
from .runs import read_config, read_metrics
from .summary import kl_key


def _series(run_dir: str, key: str) -> list[tuple[int, float]]:
    return [
        (int(r["step"]), float(r[key])) for r in read_metrics(run_dir) if r.get(key) is not None
    ]


def _mean_curve(curves: Sequence[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Pointwise mean over the runs that have each step."""
    acc: dict[int, list[float]] = defaultdict(list)
    for c in curves:
        for s, v in c:
            acc[s].append(v)
    return [(s, sum(v) / len(v)) for s, v in sorted(acc.items())]


def plot(
    main_rows: Sequence[dict[str, Any]],
    pilot_rows: Sequence[dict[str, Any]],
    arms: dict[str, Arm],
    path: str,
    title: str,
) -> None:
    """2x2 figure: mean held-out accuracy per arm (thin lines: seeds); masked or clipped
    fraction; behaviour-vs-proximal KL; the staleness pilot's accuracy curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(14, 9), constrained_layout=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    by_arm: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in main_rows:
        by_arm[(r["arm"], r["staleness"])].append(r)
    for i, ((name, s), rows) in enumerate(by_arm.items()):
        color = colors[i % len(colors)]
        arm = arms.get(name)
        label = f"{arm.label if arm else name}, s={s} ({len(rows)} seeds)"
        metric = arm.metric if arm else "actor/clip_fraction"
        panels = (
            (axes[0][0], "eval/accuracy"),
            (axes[0][1], metric),
            (axes[1][0], kl_key(read_config(rows[0]["run_dir"]))),
        )
        for ax, key in panels:
            curves = [_series(r["run_dir"], key) for r in rows]
            for c in curves:
                if c and key == "eval/accuracy":
                    ax.plot(*zip(*c), color=color, alpha=0.3, lw=0.8)
            mc = _mean_curve(curves)
            if mc:
                marker = "o" if key == "eval/accuracy" else None
                ax.plot(*zip(*mc), color=color, lw=1.8, marker=marker, ms=4, label=label)
    for i, r in enumerate(pilot_rows):
        c = _series(r["run_dir"], "eval/accuracy")
        if c:
            lab = f"{r['arm']}, s={r['staleness']}, seed {r['seed']}"
            lab += "" if r["done"] else f" (in progress, update {r['steps_done']})"
            axes[1][1].plot(*zip(*c), color=colors[i % len(colors)], marker="o", ms=4, label=lab)
    axes[0][0].set_title("held-out greedy accuracy (mean over seeds; thin: each seed)")
    axes[0][1].set_title("M2PO masked fraction (M2PO arms) / PPO clip fraction (others)")
    axes[1][0].set_title("behaviour-vs-proximal KL (k1, nats/token)")
    axes[1][1].set_title("staleness pilot: held-out accuracy")
    for ax in axes.flat:
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
