"""Plot a run's metrics: ``python -m areal_m2po.plot RUN_DIR [--out FILE.png]``.

Reads ``RUN_DIR/metrics.jsonl`` and writes one PNG with reward, held-out accuracy, M2PO masked
fraction, clip fraction, KL and gradient norm against the training step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

PANELS = (
    ("reward/mean", "reward (mean)"),
    ("eval/accuracy", "held-out greedy accuracy"),
    ("m2po/masked_fraction", "M2PO masked fraction"),
    ("actor/clip_fraction", "clip fraction"),
    ("actor/kl", "KL"),
    ("actor/grad_norm", "grad norm"),
)


def read_metrics(path: str) -> list[dict[str, float]]:
    """The records of a metrics.jsonl; a malformed line raises ValueError naming file:line."""
    records = []
    with open(path) as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
    return records


def plot_run(run_dir: str, out: str | None = None) -> str:
    """Write the PNG and return its path (default ``RUN_DIR/metrics.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"{metrics_path} does not exist (is {run_dir} a run directory?)")
    records = read_metrics(metrics_path)
    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5), constrained_layout=True)
    for ax, (key, title) in zip(axes.flat, PANELS):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(pts) < 30 else None, ms=3)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(os.path.abspath(run_dir), fontsize=9)
    out = out or os.path.join(run_dir, "metrics.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m areal_m2po.plot", description=__doc__)
    parser.add_argument("run_dir", help="run directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default RUN_DIR/metrics.png)")
    args = parser.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
