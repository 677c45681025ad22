"""The report's tables and numbers as text: formatting, the per-run and per-arm tables, the
accuracy curves, the settings read from the runs' configs, the CSV."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from typing import Any

from .runs import read_config, read_metrics
from .summary import paired_difference, summarise_arm


def nan(x: Any) -> bool:
    return x == "" or x is None or (isinstance(x, float) and math.isnan(x))


def pct(x: Any, digits: int = 1) -> str:
    return "" if nan(x) else f"{100 * x:.{digits}f}"


def num(x: Any, digits: int = 2) -> str:
    return "" if nan(x) else f"{x:.{digits}f}"


def pm(m: Any, se: Any, scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± se`` (scaled; se omitted when undefined)."""
    if nan(m):
        return ""
    text = f"{scale * m:.{digits}f}"
    return text if nan(se) else f"{text} ± {scale * se:.{digits}f}"


def final(row: dict[str, Any]) -> str:
    """The last evaluation; for a run still in progress, marked as the latest so far."""
    if row["done"] or nan(row["final_accuracy"]):
        return pct(row["final_accuracy"])
    return f"(latest: {pct(row['final_accuracy'])})"


def minutes(seconds: Any) -> str:
    return "" if nan(seconds) else f"{seconds / 60:.0f}"


def wall_cpu(row: dict[str, Any]) -> str:
    if nan(row["wall_s"]):
        return ""  # an attempt is running, or one was killed before recording its time
    return f"{minutes(row['wall_s'])} / {minutes(row['cpu_s'])}"


def fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.8g}"
    return str(v)


def write_csv(rows: Sequence[dict[str, Any]], path: str, columns: Sequence[str]) -> None:
    """``rows`` as CSV with ``columns`` (8 significant digits, yes/no, blank for missing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: fmt(row.get(k, "")) for k in columns})


def _cell(col: dict[str, Any], label: str, s: int, n_seeds: int, a: dict[str, Any], d: Any) -> str:
    """One cell of :func:`arm_table` (``a``: the arm's summary; ``d``: its paired difference)."""
    value = col.get("value")
    if value == "label":
        return label
    if value == "s":
        return str(s)
    if value == "seeds":
        return f"{a['n']} of {n_seeds}"
    if value == "collapsed":
        return f"{a['collapsed']} of {a['n']}"
    if value == "minutes":
        return f"{pm(a['wall_s'], a['wall_s_se'], 1 / 60, 0)} / {pm(a['cpu_s'], a['cpu_s_se'], 1 / 60, 0)}"
    if value == "paired":
        if d is None or d["n"] < 2:
            return ""
        return f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
    stat = col["stat"]
    text = pm(a[stat], a[stat + "_se"], col.get("scale", 100.0), col.get("digits", 1))
    return text or col.get("empty", "")


Cell = tuple[str, int]  # (arm, staleness)


def arm_table(
    columns: Sequence[dict[str, Any]],
    cells: Sequence[tuple[Cell, str, list[dict[str, Any]]]],
    n_seeds: int,
    baseline: tuple[Cell, list[dict[str, Any]]] | None = None,
    extra_metrics: Sequence[str] = (),
) -> list[str]:
    """The per-arm Markdown table: one row per ``((arm, staleness), label, finished runs)``,
    mean ± standard error over the runs in each ``columns`` entry (``header`` and either
    ``value``: label, s, seeds, collapsed, minutes, paired (the difference of ``measure`` to
    the ``baseline`` cell's runs, paired by seed; blank on the baseline's own row), or
    ``stat``: a summary column with ``scale``, ``digits`` and the text when undefined,
    ``empty``)."""
    out = ["| " + " | ".join(c["header"] for c in columns) + " |", "|" + "---|" * len(columns)]
    for (arm, s), label, rows in cells:
        if not rows:
            out.append(f"| {label} | {s} | 0 of {n_seeds} |" + " |" * (len(columns) - 3))
            continue
        a = summarise_arm(rows, extra_metrics)
        texts = []
        for col in columns:
            d = None
            if col.get("value") == "paired" and baseline and baseline[0] != (arm, s):
                d = paired_difference(rows, baseline[1], col.get("measure", "auc_accuracy"))
            texts.append(_cell(col, label, s, n_seeds, a, d))
        out.append("| " + " | ".join(texts) + " |")
    return out


def runs_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "| arm | s | seed | done | initial | final | best (update) | AUC | masked/clipped % | "
        "behave-prox KL | m2 before | entropy (last 5) | collapsed | no-EOS % (last 5) | "
        "updates (with signal) | s/update (median) | s/eval | minutes (wall / CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['arm']} | {r['staleness']} | {r['seed']} | {fmt(r['done'])} | "
            f"{pct(r['initial_accuracy'])} | {final(r)} | "
            f"{pct(r['best_accuracy'])} ({r['best_step']}) | {pct(r['auc_accuracy'])} | "
            f"{pct(r['masked_or_clipped_fraction'], 2)} | {num(r['behave_kl'], 4)} | "
            f"{num(r['m2_before'], 4)} | {num(r['entropy_last5'])} | {fmt(r['collapsed']) or 'n/a'} | "
            f"{pct(r['no_eos_last5'])} | {r['steps_done']}/{r['steps_planned']} "
            f"({r['updates_with_signal']}) | {num(r['step_s_median'], 1)} | "
            f"{num(r['eval_s_mean'], 0)} | {wall_cpu(r)} |"
        )
    return out


def curve_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Held-out accuracy (%) at every evaluation, one row per run."""
    curves = []
    for r in rows:
        recs = read_metrics(r["run_dir"])
        curves.append({int(x["step"]): x["eval/accuracy"] for x in recs if "eval/accuracy" in x})
    steps = sorted({s for c in curves for s in c})
    if not steps:
        return []
    out = [
        "| arm | s | seed | " + " | ".join(f"update {s}" for s in steps) + " |",
        "|---|---|---|" + "---|" * len(steps),
    ]
    for r, c in zip(rows, curves):
        cells = " | ".join(pct(c[s]) if s in c else "" for s in steps)
        out.append(f"| {r['arm']} | {r['staleness']} | {r['seed']} | {cells} |")
    return out


SETTING_KEYS = (
    ("actor.path", "model"),
    ("actor.dtype", "dtype"),
    ("actor.optimizer.lr", "learning rate (AdamW, constant)"),
    ("actor.optimizer.gradient_clipping", "gradient clipping (global L2 norm)"),
    ("actor.ppo_n_minibatches", "optimizer steps per batch"),
    ("actor.kl_ctl", "KL coefficient"),
    ("actor.skip_zero_adv_seqs", "skip zero-advantage sequences in the backward pass"),
    ("total_train_steps", "updates per run"),
    ("train_dataset.path", "train prompts"),
    ("train_dataset.batch_size", "prompts per update"),
    ("gconfig.n_samples", "samples per prompt"),
    ("gconfig.max_new_tokens", "max new tokens"),
    ("gconfig.temperature", "sampling temperature"),
    ("valid_dataset.path", "eval prompts"),
    ("valid_dataset.split", "eval split"),
    ("valid_dataset.max_samples", "eval problems (greedy)"),
    ("evaluator.freq_steps", "evaluate every N updates (and at start/end)"),
    ("reward.path", "reward"),
    ("recover.freq_steps", "recover checkpoint every N updates (resumable runs)"),
    ("num_threads", "torch threads per run"),
)


def _get(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def settings_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The shared settings, read from each run's own config.yaml (what was really used)."""
    configs = [c for c in (read_config(r["run_dir"]) for r in rows) if c]
    if not configs:
        return ["- (no run config.yaml found)"]
    out = []
    for key, label in SETTING_KEYS:
        values = list(dict.fromkeys(json.dumps(_get(c, key), sort_keys=True) for c in configs))
        shown = " / ".join(values)
        note = " (differs between runs)" if len(values) > 1 else ""
        out.append(f"- {label} (`{key}`): `{shown}`{note}")
    stale = sorted({int(_get(c, "rollout.staleness") or 0) for c in configs})
    seeds = sorted({int(_get(c, "seed") or 0) for c in configs})
    out.append(f"- seeds (`seed`): {', '.join(map(str, seeds))}")
    out.append(
        f"- staleness (`rollout.staleness`): {', '.join(map(str, stale))} - exact: the batch "
        "trained at update t was generated by the policy of update t - s; the first s updates "
        "train on rollouts of the initial policy"
    )
    return out


def round1_section(path: str) -> list[str]:
    """The round-1 pilot's table, from its CSV (lr 3e-5, 4 prompts, 64 problems, one seed)."""
    if not path or not os.path.exists(path):
        return []
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    out = [
        "| method | s | seed | initial | final | best (update) | masked/clipped % | collapsed | "
        "entropy (last 5) | no-EOS % (last 5) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def pct(k: str, r: dict[str, str] = r) -> str:
            return f"{100 * float(r[k]):.1f}" if r.get(k) else ""

        out.append(
            f"| {r['method']} | {r['staleness']} | {r['seed']} | {pct('initial_accuracy')} | "
            f"{pct('final_accuracy')} | {pct('best_accuracy')} ({r['best_step']}) | "
            f"{pct('masked_or_clipped_fraction')} | {r['collapsed']} | "
            f"{float(r['entropy_last5']):.2f} | {pct('no_eos_last5')} |"
        )
    return out
