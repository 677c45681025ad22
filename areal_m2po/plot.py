"""Plot a run's metrics: ``python -m areal_m2po.plot RUN_DIR [--out FILE.png]``.

Reads ``RUN_DIR/metrics.jsonl`` and writes one PNG of six panels against the training step:

* the mean training reward and the held-out greedy accuracy (``eval/accuracy``);
* M2PO: the mean m2 per token before and after masking (``m2po/m2_before``, ``m2po/m2_after``,
  log scale) against the threshold (dashed line), with the masked-token fraction in the title:
  the mask acts only when ``m2_before`` crosses the line;
* the behaviour-vs-proximal KL, ``actor/behave_kl`` = mean(behave_logp - prox_logp) per token
  in nats: how far the policy moved since it generated the batch, the drift M2PO watches;
* the policy entropy per token (nats) and the mean generation length (tokens).

A panel whose metrics the run did not log (M2PO off, no evaluation) says so. A supervised
fine-tuning run (``python -m areal_m2po.train_sft``, metrics ``sft/...``) gets its own panels
(:data:`SFT_PANELS`): training and held-out loss, held-out perplexity, gradient norm, learning
rate and completion tokens per step.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Any

from areal_m2po.utils import stats_logger
from areal_m2po.utils.extras import require_extra


@dataclass(frozen=True)
class Panel:
    """One subplot: metric keys drawn as lines, and an optional metric drawn as a level."""

    title: str
    series: tuple[tuple[str, str], ...]  # (metrics.jsonl key, legend label)
    ylabel: str = ""
    level: str | None = None  # key whose last value is drawn as a dashed horizontal line
    log_y: bool = False


PANELS = (
    Panel("reward (mean over samples)", (("reward/mean", "reward/mean"),)),
    Panel("held-out greedy accuracy", (("eval/accuracy", "eval/accuracy"),)),
    Panel(
        "M2PO: mean m2 per token",
        (("m2po/m2_before", "before masking"), ("m2po/m2_after", "after masking")),
        ylabel="(behave_logp - prox_logp)^2",
        level="m2po/threshold",
        log_y=True,
    ),
    Panel(
        "behaviour vs proximal KL",
        (("actor/behave_kl", "actor/behave_kl"),),
        ylabel="nats / token",
    ),
    Panel("policy entropy", (("actor/entropy", "actor/entropy"),), ylabel="nats / token"),
    Panel(
        "generation length", (("rollout/gen_len_mean", "rollout/gen_len_mean"),), ylabel="tokens"
    ),
)

SFT_PANELS = (
    Panel(
        "loss (nats per completion token)",
        (("sft/loss", "train"), ("eval/loss", "held-out")),
        ylabel="nats / token",
    ),
    Panel("held-out perplexity", (("eval/perplexity", "eval/perplexity"),), log_y=True),
    Panel("gradient norm (before clipping)", (("sft/grad_norm", "sft/grad_norm"),)),
    Panel("learning rate", (("sft/lr", "sft/lr"),)),
    Panel("completion tokens per step", (("sft/n_tokens", "sft/n_tokens"),), ylabel="tokens"),
    Panel("step time", (("timing/step_s", "timing/step_s"),), ylabel="s"),
)


def panels_for(records: list[dict[str, Any]]) -> tuple[Panel, ...]:
    """:data:`SFT_PANELS` for a run that logged ``sft/loss``, else the RL run's :data:`PANELS`."""
    return SFT_PANELS if any("sft/loss" in r for r in records) else PANELS


def read_metrics(path: str) -> list[dict[str, float]]:
    """The records of a metrics.jsonl (:func:`areal_m2po.utils.stats_logger.read_metrics`: a
    partial last line is skipped with a warning, a malformed line before it raises ValueError
    naming file:line)."""
    return stats_logger.read_metrics(path)


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of every record that logged ``key`` (null values skipped)."""
    pts = [(float(r["step"]), float(r[key])) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _masked_summary(records: list[dict[str, Any]]) -> str:
    _, fractions = series(records, "m2po/masked_fraction")
    if not fractions:
        return ""
    mean = 100 * sum(fractions) / len(fractions)
    return f"\nmasked tokens: mean {mean:.1f}%, max {100 * max(fractions):.1f}% of a step"


def _draw_panel(ax: Any, panel: Panel, records: list[dict[str, Any]]) -> None:
    title = panel.title
    drawn = False
    for key, label in panel.series:
        xs, ys = series(records, key)
        if xs:
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, ms=3, label=label)
            drawn = True
    if panel.level is not None:
        _, levels = series(records, panel.level)
        if levels:
            ax.axhline(levels[-1], ls="--", color="k", lw=1, label=f"threshold {levels[-1]:g}")
            title += _masked_summary(records)
    if not drawn:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    elif panel.log_y and any(y > 0 for line in ax.get_lines() for y in line.get_ydata()):
        ax.set_yscale("log", nonpositive="mask")  # on-policy steps have m2 = 0 exactly
    if drawn and len(ax.get_lines()) > 1:
        ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    if panel.ylabel:
        ax.set_ylabel(panel.ylabel, fontsize=8)
    ax.grid(alpha=0.3)


def build_figure(records: list[dict[str, Any]], title: str = "") -> Any:
    """A matplotlib Figure with one axis per entry of :func:`panels_for`, in that order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7), constrained_layout=True)
    for ax, panel in zip(axes.flat, panels_for(records)):
        _draw_panel(ax, panel, records)
    if title:
        fig.suptitle(title, fontsize=9)
    return fig


def plot_run(run_dir: str, out: str | None = None) -> str:
    """Write the PNG and return its path (default ``RUN_DIR/metrics.png``)."""
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"{metrics_path} does not exist (is {run_dir} a run directory?)")
    fig = build_figure(read_metrics(metrics_path), os.path.abspath(run_dir))
    import matplotlib.pyplot as plt

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
        require_extra("python -m areal_m2po.plot", "plotting", "plot")
        path = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
