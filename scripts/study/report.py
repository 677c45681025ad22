"""The study's report: CSV, PNG and Markdown computed from the run directories alone.

Only the text between the ``<!-- NAME:start -->`` / ``<!-- NAME:end -->`` markers of an existing
Markdown report is hand-written; it is kept when the report is regenerated.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from study import verdicts as V
from study.arms import Arm
from study.figure import plot
from study.runs import RunKey, discover, read_config
from study.summary import (
    COLLAPSE_DEFINITION,
    RUN_COLUMNS,
    paired_difference,
    summarise_arm,
    summarise_run,
)

HAND_BLOCKS = ("reading", "pilot-reading")


@dataclass
class ReportInputs:
    """What the report covers and where it reads and writes."""

    arms: dict[str, Arm]  # every arm known (arms.yaml)
    study_arms: list[str]  # the arms of this study, in order
    staleness: int  # the study's s
    seeds: list[int]  # the planned seeds
    steps: int  # planned updates per run
    roots: list[str]  # run directories' parents: the archive first, then the work dir
    csv: str
    png: str
    md: str
    pilot: list[str] = field(default_factory=list)  # run names of the staleness pilot
    round1_csv: str = ""  # the round-1 pilot's CSV, rendered below the results
    commands: str = ""  # the invocations that trained the runs
    model: str = ""
    settings_note: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------- formatting
def _nan(x: Any) -> bool:
    return x == "" or x is None or (isinstance(x, float) and math.isnan(x))


def _pct(x: Any, digits: int = 1) -> str:
    return "" if _nan(x) else f"{100 * x:.{digits}f}"


def _num(x: Any, digits: int = 2) -> str:
    return "" if _nan(x) else f"{x:.{digits}f}"


def _pm(m: Any, se: Any, scale: float = 100.0, digits: int = 1) -> str:
    """``mean ± se`` (scaled; se omitted when undefined)."""
    if _nan(m):
        return ""
    text = f"{scale * m:.{digits}f}"
    return text if _nan(se) else f"{text} ± {scale * se:.{digits}f}"


def _final(row: dict[str, Any]) -> str:
    """The last evaluation; for a run still in progress, marked as the latest so far."""
    if row["done"] or _nan(row["final_accuracy"]):
        return _pct(row["final_accuracy"])
    return f"(latest: {_pct(row['final_accuracy'])})"


def _minutes(seconds: Any) -> str:
    return "" if _nan(seconds) else f"{seconds / 60:.0f}"


def _wall_cpu(row: dict[str, Any]) -> str:
    if _nan(row["wall_s"]):
        return ""  # an attempt is running, or one was killed before recording its time
    return f"{_minutes(row['wall_s'])} / {_minutes(row['cpu_s'])}"


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.8g}"
    return str(v)


def kept_block(md_path: str, name: str) -> str:
    """The hand-written text between ``name``'s markers in an existing report ("" if none)."""
    if not os.path.exists(md_path):
        return ""
    with open(md_path) as fh:
        text = fh.read()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start in text and end in text:
        return text.split(start, 1)[1].split(end, 1)[0].strip("\n")
    return ""


def _block(md_path: str, name: str) -> list[str]:
    kept = kept_block(md_path, name) or "(not written yet)"
    return [f"<!-- {name}:start -->", kept, f"<!-- {name}:end -->"]


# ------------------------------------------------------------------------------------- rows
def collect(inp: ReportInputs) -> list[dict[str, Any]]:
    """One summary row per run directory found under ``inp.roots``."""
    rows = []
    for key, run_dir in discover(inp.roots).items():
        arm = inp.arms.get(key.arm)
        metric = arm.metric if arm else "actor/clip_fraction"
        rows.append(summarise_run(run_dir, key, inp.steps, metric))
    order = {name: i for i, name in enumerate(inp.arms)}
    rows.sort(key=lambda r: (order.get(r["arm"], len(order)), r["staleness"], r["seed"]))
    return rows


def study_keys(inp: ReportInputs) -> list[RunKey]:
    return [
        RunKey(a, inp.arms[a].staleness_at(inp.staleness), seed)
        for seed in inp.seeds
        for a in inp.study_arms
    ]


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=RUN_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _fmt(row[k]) for k in RUN_COLUMNS})


# ---------------------------------------------------------------------------------- sections
def status_section(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    by_name = {RunKey(r["arm"], r["staleness"], r["seed"]).name: r for r in rows}
    done, pending = [], []
    for key in study_keys(inp):
        r = by_name.get(key.name)
        if r and r["done"]:
            done.append(key.name)
        elif r:
            pending.append(f"{key.name} (in progress: update {r['steps_done']}/{inp.steps})")
        else:
            pending.append(f"{key.name} (not started)")
    total = len(done) + len(pending)
    out = [f"**{len(done)} of {total} runs of the study (s={inp.staleness}) are finished.**", ""]
    out.append("- finished: " + (", ".join(done) if done else "none"))
    out.append("- pending: " + (", ".join(pending) if pending else "none"))
    if pending:
        out += [
            "",
            "Numbers below use the finished runs only; a claim is judged only when all its "
            "runs are finished.",
        ]
    return out


def _arm_rows(rows: Sequence[dict[str, Any]], name: str, s: int) -> list[dict[str, Any]]:
    return [r for r in rows if r["arm"] == name and r["staleness"] == s and r["done"]]


def arms_table(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "| arm | s | seeds finished | final % | best % | AUC % | masked/clipped % | "
        "behave-prox KL | m2 before masking | entropy (last 5) | collapsed | minutes/run (wall / CPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in inp.study_arms:
        s = inp.arms[name].staleness_at(inp.staleness)
        sel = _arm_rows(rows, name, s)
        if not sel:
            out.append(f"| {name} | {s} | 0 of {len(inp.seeds)} | | | | | | | | | |")
            continue
        a = summarise_arm(sel)
        out.append(
            f"| {name} | {s} | {a['n']} of {len(inp.seeds)} | "
            f"{_pm(a['final_accuracy'], a['final_accuracy_se'])} | "
            f"{_pm(a['best_accuracy'], a['best_accuracy_se'])} | "
            f"{_pm(a['auc_accuracy'], a['auc_accuracy_se'])} | "
            f"{_pm(a['masked_or_clipped_fraction'], a['masked_or_clipped_fraction_se'], 100, 2)} | "
            f"{_pm(a['behave_kl'], a['behave_kl_se'], 1, 4)} | "
            f"{_pm(a['m2_before'], a['m2_before_se'], 1, 4) or 'not measured'} | "
            f"{_pm(a['entropy_last5'], a['entropy_last5_se'], 1, 2)} | "
            f"{a['collapsed']} of {a['n']} | {_pm(a['wall_s'], a['wall_s_se'], 1 / 60, 0)} / "
            f"{_pm(a['cpu_s'], a['cpu_s_se'], 1 / 60, 0)} |"
        )
    return out


def _onpolicy(inp: ReportInputs) -> str | None:
    return next((a for a in inp.study_arms if inp.arms[a].staleness == "on_policy"), None)


def paired_table(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    base_name = _onpolicy(inp)
    if base_name is None:
        return []
    base = _arm_rows(rows, base_name, 0)
    out = [
        f"Differences to {base_name} of the same seed, in points: mean ± standard error over "
        "seeds [95% t interval].",
        "",
        "| arm | s | seeds paired | final | best | AUC |",
        "|---|---|---|---|---|---|",
    ]
    for name in inp.study_arms:
        if name == base_name:
            continue
        s = inp.arms[name].staleness_at(inp.staleness)
        sel = _arm_rows(rows, name, s)
        cells = []
        for col in ("final_accuracy", "best_accuracy", "auc_accuracy"):
            d = paired_difference(sel, base, col)
            ci = "" if _nan(d["lo"]) else f" [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
            cells.append("" if not d["n"] else f"{_pm(d['mean'], d['se'])}{ci}")
        n = paired_difference(sel, base, "final_accuracy")["n"]
        out.append(f"| {name} | {s} | {n} | " + " | ".join(cells) + " |")
    return out


def verdict_section(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    s = inp.staleness
    need = len(inp.seeds)

    def arm(name: str) -> list[dict[str, Any]]:
        a = inp.arms.get(name)
        return _arm_rows(rows, name, a.staleness_at(s)) if a and name in inp.study_arms else []

    def ready(*names: str) -> tuple[bool, str]:
        counts = {n: len(arm(n)) for n in names}
        ok = need >= 2 and all(c >= need for c in counts.values())
        return ok, "waiting for " + ", ".join(
            f"{n} ({c} of {need} seeds)" for n, c in counts.items()
        )

    on, grpo, noclip, m2po = arm("grpo_onpolicy"), arm("grpo"), arm("grpo_noclip"), arm("m2po")
    d = paired_difference
    items = [
        (f"GRPO loses accuracy at staleness {s}", ("grpo_onpolicy", "grpo"), V.grpo_degrades,
         lambda: (d(grpo, on, "final_accuracy"),)),
        ("GRPO without a trust region prospers, then collapses", ("grpo_onpolicy", "grpo_noclip"),
         V.noclip_collapses,
         lambda: (summarise_arm(noclip), d(noclip, on, "best_accuracy"))),
        (f"M2PO at staleness {s} keeps on-policy accuracy", ("grpo_onpolicy", "m2po"),
         V.m2po_matches_onpolicy, lambda: (d(m2po, on, "final_accuracy"),)),
        (f"M2PO beats GRPO at staleness {s}", ("grpo", "m2po"), V.m2po_beats_grpo,
         lambda: (d(m2po, grpo, "final_accuracy"),)),
        ("M2PO masks only a tiny fraction of the tokens (paper: 0.06%)", ("m2po",),
         V.masked_fraction_small, lambda: (summarise_arm(m2po),)),
    ]  # fmt: skip
    out = ["| claim (paper) | verdict here | numbers |", "|---|---|---|"]
    for claim, names, rule, args in items:
        ok, missing = ready(*names)
        v = V.judge(claim, ok, missing, rule, *(args() if ok else ()))
        out.append(f"| {v.claim} | **{v.verdict}** | {v.because} |")
    out += [
        "",
        "Rules: a claim is judged only when all its arms have every planned seed finished; a "
        "difference is significant when its 95% paired t interval over seeds excludes 0; "
        f"'keeps on-policy accuracy' means a loss larger than {100 * V.MARGIN:.0f} points (half "
        "the paper's GRPO drop, 50.7 -> 40.1) is excluded by the interval, and the GRPO drop "
        "is 'not reproduced' when the interval excludes such a drop; for the collapse claim, most seeds "
        "collapse while the best accuracy stays within that margin of on-policy's best; the "
        "masked fraction is 'of the paper's order' below 10x 0.06% (mean + 2 standard errors).",
    ]
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
            f"| {r['arm']} | {r['staleness']} | {r['seed']} | {_fmt(r['done'])} | "
            f"{_pct(r['initial_accuracy'])} | {_final(r)} | "
            f"{_pct(r['best_accuracy'])} ({r['best_step']}) | {_pct(r['auc_accuracy'])} | "
            f"{_pct(r['masked_or_clipped_fraction'], 2)} | {_num(r['behave_kl'], 4)} | "
            f"{_num(r['m2_before'], 4)} | {_num(r['entropy_last5'])} | {_fmt(r['collapsed']) or 'n/a'} | "
            f"{_pct(r['no_eos_last5'])} | {r['steps_done']}/{r['steps_planned']} "
            f"({r['updates_with_signal']}) | {_num(r['step_s_median'], 1)} | "
            f"{_num(r['eval_s_mean'], 0)} | {_wall_cpu(r)} |"
        )
    return out


def curve_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Held-out accuracy (%) at every evaluation, one row per run."""
    from study.runs import read_metrics

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
        cells = " | ".join(_pct(c[s]) if s in c else "" for s in steps)
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


def methods_table(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    out = [
        "| arm | staleness | definition | config keys |",
        "|---|---|---|---|",
    ]
    for name in dict.fromkeys([*inp.study_arms, *(r["arm"] for r in rows)]):
        a = inp.arms.get(name)
        if a is None:
            continue
        s = a.staleness_at(inp.staleness) if a.staleness == "stale" else 0
        keys = ", ".join(f"`{o}`" for o in a.overrides)
        out.append(
            f"| {name} | {'s' if a.staleness == 'stale' else 0} (= {s}) | {a.note} | {keys} |"
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


def pilot_status(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    if not inp.pilot:
        return []
    state = {RunKey(r["arm"], r["staleness"], r["seed"]).name: r for r in rows}

    def word(name: str) -> str:
        r = state.get(name)
        if r is None:
            return "not started"
        return "finished" if r["done"] else f"in progress: update {r['steps_done']}/{inp.steps}"

    return ["Pilot runs: " + ", ".join(f"{n} ({word(n)})" for n in inp.pilot) + ".", ""]


def pilot_rows(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The staleness pilot's runs, and any run found outside the study's (arm, s, seed) grid."""
    keys = {k.name for k in study_keys(inp)}
    out = []
    for r in rows:
        name = RunKey(r["arm"], r["staleness"], r["seed"]).name
        if name in inp.pilot or name not in keys:
            out.append(r)
    return sorted(out, key=lambda r: (r["arm"] != "grpo_onpolicy", r["arm"], r["staleness"]))


RESULTS_NOTE = (
    "Per arm, mean ± standard error over the finished seeds (accuracy in percent, greedy, "
    "held-out). AUC = area under the accuracy-vs-update curve / updates (the mean accuracy "
    f"over training). {COLLAPSE_DEFINITION}. masked/clipped = mean over the updates with a "
    "learning signal (grad norm > 0) of the M2PO masked-token fraction (M2PO arms) or the "
    "PPO clip fraction (GRPO arms). behave-prox KL = mean of log pi_behave - log pi_prox per "
    "token (k1); for the GRPO arms (no proximal forward) it is log pi_behave - log pi_theta "
    "at the single optimizer step, the same quantity. m2 before masking = mean of "
    "(log pi_behave - log pi_prox)^2, measured only where the M2PO mask is computed."
)


def _round1(inp: ReportInputs) -> list[str]:
    r1 = round1_section(inp.round1_csv)
    if not r1:
        return []
    md = inp.round1_csv[:-4] + ".md"
    link = os.path.relpath(md, os.path.dirname(os.path.abspath(inp.md)))
    return [
        "## Pilot (round 1)",
        "",
        "The first, one-seed pilot (lr 3e-5, 4 prompts x 8 samples, 12 new tokens, 64 eval "
        "problems every 5 updates, s=4, 20 updates; commit 6cbd8b1). Its full report with its "
        f"reading: [{os.path.basename(md)}]({link}).",
        "",
        *r1,
        "",
    ]


def _appendix(inp: ReportInputs, rows: Sequence[dict[str, Any]], command: str) -> list[str]:
    """Settings (read from the runs' configs), the arms' definitions and the commands."""
    return [
        "## Settings",
        "",
        *settings_section(rows),
        *inp.settings_note,
        "",
        "## Methods",
        "",
        *methods_table(inp, rows),
        "",
        "## Commands",
        "",
        "```",
        (inp.commands.strip() + "\n# report regenerated with:\n" + command).strip(),
        "```",
        "",
        *_round1(inp),
    ]


def write_report(inp: ReportInputs, command: str) -> list[dict[str, Any]]:
    """Write ``inp.csv``, ``inp.png`` and ``inp.md`` from the run directories; the rows."""
    rows = collect(inp)
    keys = {k.name for k in study_keys(inp)}
    main = [r for r in rows if RunKey(r["arm"], r["staleness"], r["seed"]).name in keys]
    pilot = pilot_rows(inp, rows)
    write_csv(rows, inp.csv)
    title = f"{inp.model}: stale-data study, s={inp.staleness} (finished runs)"
    plot([r for r in main if r["done"]], pilot, inp.arms, inp.png, title)
    png = os.path.relpath(inp.png, os.path.dirname(os.path.abspath(inp.md)))
    out = [
        "# Stale-data study, round 2: GRPO vs M2PO on rollouts s updates old",
        "",
        "Generated by `scripts/stale_study.py` from the run directories' metrics.jsonl and "
        "config.yaml (finished runs are kept in the repository); only the text between the "
        "reading markers is written by hand. Regenerate with "
        "`python scripts/stale_study.py --replot`.",
        "",
        "Round 3 (the paper's regime, where the second moment sits near the threshold, and the "
        "paper's final Algorithm 1 over the trust-region quadrant tokens): "
        "[stale_study_round3.md](stale_study_round3.md).",
        "",
        "## Status",
        "",
        *status_section(inp, rows),
        "",
        "## Verdicts on the paper's claims",
        "",
        *verdict_section(inp, rows),
        "",
        f"## Results at staleness {inp.staleness}",
        "",
        RESULTS_NOTE,
        "",
        *arms_table(inp, rows),
        "",
        *paired_table(inp, rows),
        "",
        f"![study figure]({png})",
        "",
        "## Reading",
        "",
        *_block(inp.md, "reading"),
        "",
        "## Staleness pilot",
        "",
        *pilot_status(inp, rows),
        *runs_table(pilot),
        "",
        *_block(inp.md, "pilot-reading"),
        "",
        "## Every run",
        "",
        *runs_table(main),
        "",
        "Held-out accuracy (%) at each evaluation:",
        "",
        *curve_table(main + [r for r in pilot if r not in main]),
        "",
        *_appendix(inp, rows, command),
    ]
    os.makedirs(os.path.dirname(os.path.abspath(inp.md)), exist_ok=True)
    with open(inp.md, "w") as fh:
        fh.write("\n".join(out))
    return rows
