"""Plot a run's metrics: ``python -m areal_m2po.plot RUN_DIR [--out FILE.png]``; compare runs:
``python -m areal_m2po.plot RUN_A RUN_B ... --out FILE.png [--labels A,B,...]``.

Reads ``RUN_DIR/metrics.jsonl`` and writes one PNG of six panels against the training step:

* the mean training reward and the held-out greedy accuracy (``eval/accuracy``);
* M2PO: the mean m2 per token before and after masking (``m2po/m2_before``, ``m2po/m2_after``,
  log scale) against the threshold (dashed line), with the masked-token fraction in the title:
  the mask acts only when ``m2_before`` crosses the line;
* the behaviour-vs-proximal KL, ``actor/behave_kl`` = mean(behave_logp - prox_logp) per token
  in nats: how far the policy moved since it generated the batch, the drift M2PO watches;
* the policy entropy per token (nats) and the mean generation length (tokens).

Given several run directories it writes one figure of :data:`COMPARE_PANELS` instead, each
run's lines in its own colour: the held-out accuracy, the share of tokens the M2PO mask or the
PPO clip took out of the gradient (``m2po/masked_fraction``, ``actor/clip_fraction``, in %), the
reward and the entropy (runs of another trainer: that trainer's panels, below).

A panel whose metrics the run did not log (M2PO off, no evaluation) says so. The other
trainers' runs get their own panels, chosen from the metrics they logged: supervised
fine-tuning (``sft/...``, :data:`SFT_PANELS`: training and held-out loss, held-out perplexity,
gradient norm, learning rate and completion tokens per step), a reward model (``train/...``,
:data:`RM_PANELS`) and DPO (``dpo/...``, :data:`DPO_PANELS`): loss, pair accuracy and reward
margin, training and held-out, gradient norm and learning rate.
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


def _pair_panels(prefix: str, extra: Panel) -> tuple[Panel, ...]:
    """The panels of a preference trainer logging ``<prefix>/loss``, ``accuracy``, ``margin``,
    ``grad_norm`` and ``lr`` (held-out: ``eval/...``), plus ``extra``."""
    return (
        Panel("loss", ((f"{prefix}/loss", "train"), ("eval/loss", "held-out"))),
        Panel(
            "pair accuracy (chosen scored higher)",
            ((f"{prefix}/accuracy", "train"), ("eval/accuracy", "held-out")),
        ),
        Panel(
            "reward margin (chosen - rejected)",
            ((f"{prefix}/margin", "train"), ("eval/margin", "held-out")),
        ),
        Panel("gradient norm (before clipping)", ((f"{prefix}/grad_norm", f"{prefix}/grad_norm"),)),
        Panel("learning rate", ((f"{prefix}/lr", f"{prefix}/lr"),)),
        extra,
    )


RM_PANELS = _pair_panels(
    "train",
    Panel(
        "mean reward",
        (("train/mean_reward", "train"), ("eval/mean_reward", "held-out")),
    ),
)
DPO_PANELS = _pair_panels(
    "dpo",
    Panel(
        "implicit rewards beta * log(pi / pi_ref)",
        (("dpo/chosen_reward", "chosen"), ("dpo/rejected_reward", "rejected")),
    ),
)

COMPARE_PANELS = (
    Panel("held-out greedy accuracy", (("eval/accuracy", "accuracy"),)),
    Panel(
        "tokens out of the gradient (% of a step's)",
        (("m2po/masked_fraction", "M2PO masked"), ("actor/clip_fraction", "PPO clipped")),
        ylabel="%",
    ),
    Panel("reward (mean over samples)", (("reward/mean", "reward"),)),
    Panel("policy entropy", (("actor/entropy", "entropy"),), ylabel="nats / token"),
)
"""The panels of a comparison; the fractions are drawn in percent."""
_PERCENT_KEYS = ("m2po/masked_fraction", "actor/clip_fraction")


_PANELS_BY_KEY = (("sft/loss", SFT_PANELS), ("dpo/loss", DPO_PANELS), ("train/loss", RM_PANELS))


def panels_for(records: list[dict[str, Any]]) -> tuple[Panel, ...]:
    """The panels of the trainer that wrote ``records``: :data:`SFT_PANELS` for a run that
    logged ``sft/loss``, :data:`DPO_PANELS` for ``dpo/loss``, :data:`RM_PANELS` for
    ``train/loss`` (the reward model), else the RL run's :data:`PANELS`."""
    for key, panels in _PANELS_BY_KEY:
        if any(key in r for r in records):
            return panels
    return PANELS


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


def build_comparison(runs: list[tuple[str, list[dict[str, Any]]]]) -> Any:
    """A matplotlib Figure of :data:`COMPARE_PANELS` (RL runs; the runs of another trainer: its
    own panels, :func:`panels_for`) over ``runs`` (``(label, records)``): one colour per run,
    the line style per metric, legend entries ``"<label>: <metric label>"``.

    Raises:
        ValueError: the runs come from different trainers.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = {panels_for(records) for _, records in runs}
    if len(kinds) > 1:
        raise ValueError("the runs to compare come from different trainers (RL, SFT, RM, DPO)")
    panels = COMPARE_PANELS if kinds == {PANELS} else kinds.pop()
    fig, axes = plt.subplots(2, len(panels) // 2, figsize=(11, 7), constrained_layout=True)
    styles = ("-", "--", ":")
    for ax, panel in zip(axes.flat, panels):
        for colour, (label, records) in enumerate(runs):
            for style, (key, name) in zip(styles, panel.series):
                xs, ys = series(records, key)
                if not xs:
                    continue
                scale = 100.0 if key in _PERCENT_KEYS else 1.0
                ax.plot(
                    xs,
                    [scale * y for y in ys],
                    ls=style,
                    color=f"C{colour}",
                    marker="o" if len(xs) < 30 else None,
                    ms=3,
                    label=f"{label}: {name}",
                )
        if ax.get_lines():
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        if panel.ylabel:
            ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.grid(alpha=0.3)
    return fig


def _run_records(run_dir: str) -> list[dict[str, float]]:
    metrics_path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(metrics_path):
        raise FileNotFoundError(f"{metrics_path} does not exist (is {run_dir} a run directory?)")
    return read_metrics(metrics_path)


def plot_comparison(run_dirs: list[str], out: str, labels: list[str] | None = None) -> str:
    """Write the comparison PNG of ``run_dirs`` to ``out`` and return it; ``labels`` default
    to the directories' names."""
    if labels is None:
        labels = [os.path.basename(os.path.normpath(d)) for d in run_dirs]
    if len(labels) != len(run_dirs):
        raise ValueError(f"--labels: {len(labels)} labels for {len(run_dirs)} runs")
    fig = build_comparison([(lab, _run_records(d)) for lab, d in zip(labels, run_dirs)])
    import matplotlib.pyplot as plt

    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def plot_run(run_dir: str, out: str | None = None) -> str:
    """Write the PNG and return its path (default ``RUN_DIR/metrics.png``)."""
    fig = build_figure(_run_records(run_dir), os.path.abspath(run_dir))
    import matplotlib.pyplot as plt

    out = out or os.path.join(run_dir, "metrics.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m areal_m2po.plot",
        description="Plot the metrics.jsonl of a run of any trainer (RL, SFT, reward model, "
        "DPO) into RUN_DIR/metrics.png, or compare the RL runs of several run directories in "
        "one PNG (--out; runs of one trainer).",
    )
    parser.add_argument(
        "run_dir", nargs="+", help="run directory holding metrics.jsonl (several: compare them)"
    )
    parser.add_argument(
        "--out", default=None, help="PNG path (default RUN_DIR/metrics.png; needed to compare)"
    )
    parser.add_argument(
        "--labels", default=None, help="comma-separated run names of a comparison (default: dirs)"
    )
    args = parser.parse_args(argv)
    if len(args.run_dir) > 1 and args.out is None:
        parser.error("--out is required when comparing several runs")
    if args.out is not None:
        args.out = os.path.expanduser(args.out)
        folder = os.path.dirname(os.path.abspath(args.out))
        if os.path.isdir(args.out) or not os.path.isdir(folder):
            what = "is a folder" if os.path.isdir(args.out) else f"{folder} is not a folder"
            print(f"error: --out: {args.out}: {what}; name the PNG file to write", file=sys.stderr)
            return 2
    try:
        require_extra("python -m areal_m2po.plot", "plotting", "plot")
        if len(args.run_dir) == 1:
            path = plot_run(args.run_dir[0], args.out)
        else:
            labels = args.labels.split(",") if args.labels else None
            path = plot_comparison(args.run_dir, str(args.out), labels)  # --out required
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
