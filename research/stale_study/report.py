"""A round's report: CSV, PNG and Markdown computed from the run directories alone.

One generator for every round: the round's rules file (:mod:`.rounds`) lists the report's
sections in order, with their headings and texts; each section is a function of this module
(:data:`SECTIONS`). The runs a report covers are those of the round's cells (its plan, its
pilot, its table and its claims). Only the text between the ``<!-- NAME:start -->`` /
``<!-- NAME:end -->`` markers of an existing Markdown report is hand-written; it is kept when
the report is regenerated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import tables as T
from .arms import Arm
from .figure import plot
from .rounds import REPO_ROOT, Cell, Round, sections
from .runs import RunKey, discover
from .summary import COLLAPSE_DEFINITION, RUN_COLUMNS, paired_difference, summarise_run
from .verdicts import verdicts

Rows = list[dict[str, Any]]


@dataclass
class ReportInputs:
    """What the report covers and where it reads and writes."""

    round: Round
    arms: dict[str, Arm]  # every arm known (arms.yaml)
    study_arms: list[str]  # the arms of this invocation's plan, in order
    staleness: int  # the round's s
    seeds: list[int]  # the planned seeds
    steps: int  # planned updates per run
    roots: list[str]  # run directories' parents: the archive first, then the work dir
    csv: str
    png: str
    md: str
    pilot: list[str] = field(default_factory=list)  # run names of the staleness pilot
    round1_csv: str = ""  # the round-1 pilot's CSV, rendered by the round1 section
    commands: str = ""  # the invocations that trained the runs
    model: str = ""
    command: str = ""  # this invocation
    round_command: str = ""  # python -m research.stale_study --round N

    def fields(self) -> dict[str, Any]:
        """What a round file's texts can name."""
        return {
            "s": self.staleness,
            "margin_pts": f"{100 * self.round.margin:.0f}",
            "command": self.command,
            "round_command": self.round_command,
            "round_file": os.path.relpath(self.round.path, REPO_ROOT),
            "collapse_definition": COLLAPSE_DEFINITION,
        }


# ------------------------------------------------------------------------------------- rows
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


def study_keys(inp: ReportInputs) -> list[RunKey]:
    return [
        RunKey(a, inp.arms[a].staleness_at(inp.staleness), seed)
        for seed in inp.seeds
        for a in inp.study_arms
    ]


def table_cells(inp: ReportInputs) -> list[tuple[str, int]]:
    """The results table's (arm, staleness) cells: the round file's, else the plan's arms."""
    if inp.round.cells is not None:
        return [c.at(inp.staleness) for c in inp.round.cells]
    return [(a, inp.arms[a].staleness_at(inp.staleness)) for a in inp.study_arms]


def scope(inp: ReportInputs) -> set[tuple[str, int]]:
    """The (arm, staleness) cells the report covers: plan, pilot, table and claims."""
    cells = {(k.arm, k.staleness) for k in study_keys(inp)}
    cells |= {(k.arm, k.staleness) for k in (RunKey.parse(n) for n in inp.pilot) if k}
    cells |= set(table_cells(inp))
    cells |= {c.at(inp.staleness) for claim in inp.round.claims for c in claim.cells()}
    return cells


def collect(inp: ReportInputs) -> Rows:
    """One summary row per run directory found under ``inp.roots`` in the report's scope."""
    rows = []
    cells = scope(inp)
    for key, run_dir in discover(inp.roots).items():
        if (key.arm, key.staleness) not in cells:
            continue
        arm = inp.arms.get(key.arm)
        metric = arm.metric if arm else "actor/clip_fraction"
        rows.append(summarise_run(run_dir, key, inp.steps, metric, inp.round.run_metrics))
    order = {name: i for i, name in enumerate(inp.arms)}
    rows.sort(key=lambda r: (order.get(r["arm"], len(order)), r["staleness"], r["seed"]))
    return rows


def _done(rows: Sequence[dict[str, Any]], name: str, s: int) -> Rows:
    return [r for r in rows if r["arm"] == name and r["staleness"] == s and r["done"]]


def finished(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], Rows]:
    """The finished runs of the planned seeds, per (arm, staleness)."""
    out: dict[tuple[str, int], Rows] = {}
    for r in rows:
        if r["done"] and int(r["seed"]) in inp.seeds:
            out.setdefault((r["arm"], r["staleness"]), []).append(r)
    return out


def main_rows(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> Rows:
    """The runs of the plan's (arm, s, seed) grid."""
    keys = {k.name for k in study_keys(inp)}
    return [r for r in rows if RunKey(r["arm"], r["staleness"], r["seed"]).name in keys]


# ---------------------------------------------------------------------------------- sections
Section = Callable[[ReportInputs, Rows, dict[str, Any]], list[str]]


def status_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """Which runs of the plan are finished, in progress or not started."""
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


def verdict_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The claims' verdicts (:mod:`.verdicts`), then the ``after`` paragraphs."""
    out = [spec.get("header", "| claim | verdict | numbers |"), "|---|---|---|"]
    for v in verdicts(inp.round, finished(inp, rows), inp.staleness, inp.seeds):
        out.append(f"| {v.claim} | **{v.verdict}** | {v.because} |")
    for paragraph in spec.get("after", []):
        out += ["", paragraph.format(**inp.fields()).strip("\n")]
    return out


def results_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The per-arm table (``columns``), with an optional ``note`` above it, the paired table
    (``paired``) and the figure (``figure``) below it."""
    done = finished(inp, rows)
    cells = [(c, inp.round.labels.get(c[0], c[0]), done.get(c, [])) for c in table_cells(inp)]
    base = spec.get("baseline")
    baseline = None
    if base is not None:
        cell = Cell.parse(base, f"{inp.round.path}: results.baseline").at(inp.staleness)
        baseline = (cell, done.get(cell, []))
    table = T.arm_table(spec["columns"], cells, len(inp.seeds), baseline, inp.round.run_metrics)
    out = [spec["note"].format(**inp.fields()), ""] if spec.get("note") else []
    out += table
    if spec.get("paired"):
        out += ["", *paired_table(inp, rows)]
    if spec.get("figure"):
        png = os.path.relpath(inp.png, os.path.dirname(os.path.abspath(inp.md)))
        out += ["", f"![study figure]({png})"]
    return out


def _onpolicy(inp: ReportInputs) -> str | None:
    return next((a for a in inp.study_arms if inp.arms[a].staleness == "on_policy"), None)


def paired_table(inp: ReportInputs, rows: Sequence[dict[str, Any]]) -> list[str]:
    base_name = _onpolicy(inp)
    if base_name is None:
        return []
    base = _done(rows, base_name, 0)
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
        sel = _done(rows, name, s)
        cells = []
        for col in ("final_accuracy", "best_accuracy", "auc_accuracy"):
            d = paired_difference(sel, base, col)
            ci = "" if T.nan(d["lo"]) else f" [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
            cells.append("" if not d["n"] else f"{T.pm(d['mean'], d['se'])}{ci}")
        n = paired_difference(sel, base, "final_accuracy")["n"]
        out.append(f"| {name} | {s} | {n} | " + " | ".join(cells) + " |")
    return out


def reading_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The hand-written block ``block`` (default ``reading``)."""
    return _block(inp.md, spec.get("block", "reading"))


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


def pilot_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The staleness pilot's runs and its hand-written reading."""
    return [
        *pilot_status(inp, rows),
        *T.runs_table(pilot_rows(inp, rows)),
        "",
        *_block(inp.md, "pilot-reading"),
    ]


def every_run_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """Every run of the plan, and the held-out accuracy at each evaluation."""
    main = main_rows(inp, rows)
    pilot = pilot_rows(inp, rows)
    return [
        *T.runs_table(main),
        "",
        "Held-out accuracy (%) at each evaluation:",
        "",
        *T.curve_table(main + [r for r in pilot if r not in main]),
    ]


def settings_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The shared settings, read from the runs' own config.yaml."""
    return T.settings_section(rows)


def methods_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """Each arm's definition and config keys."""
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


def commands_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The invocations that trained the runs, and this one."""
    text = inp.commands.strip() + "\n# report regenerated with:\n" + inp.command
    return ["```", text.strip(), "```"]


def round1_section(inp: ReportInputs, rows: Rows, spec: dict[str, Any]) -> list[str]:
    """The round-1 pilot's table from its CSV, after the ``text`` paragraph (``{link}``: its
    report); nothing without the CSV."""
    r1 = T.round1_section(inp.round1_csv)
    if not r1:
        return []
    md = inp.round1_csv[:-4] + ".md"
    link = os.path.relpath(md, os.path.dirname(os.path.abspath(inp.md)))
    text = spec["text"].format(link=f"[{os.path.basename(md)}]({link})").strip("\n")
    return [text, "", *r1]


SECTIONS: dict[str, tuple[str, Section]] = {
    "status": ("Status", status_section),
    "verdicts": ("Verdicts", verdict_section),
    "results": ("Results", results_section),
    "reading": ("Reading", reading_section),
    "pilot": ("Staleness pilot", pilot_section),
    "every_run": ("Every run", every_run_section),
    "settings": ("Settings", settings_section),
    "methods": ("Methods", methods_section),
    "commands": ("Commands", commands_section),
    "round1": ("Pilot (round 1)", round1_section),
}
"""Each section kind: its default heading and the function that writes its body."""


def write_report(inp: ReportInputs) -> Rows:
    """Write ``inp.csv``, ``inp.md`` (and ``inp.png`` when a section shows the figure) from
    the run directories; the rows."""
    rows = collect(inp)
    T.write_csv(rows, inp.csv, (*RUN_COLUMNS, *inp.round.run_metrics))
    specs = sections(inp.round)
    if any(spec.get("figure") for spec in specs):
        main = main_rows(inp, rows)
        title = f"{inp.model}: stale-data study, s={inp.staleness} (finished runs)"
        plot([r for r in main if r["done"]], pilot_rows(inp, rows), inp.arms, inp.png, title)
    report = inp.round.report
    out = ["# " + report["title"].format(**inp.fields()), ""]
    for paragraph in report.get("intro", []):
        out += [paragraph.format(**inp.fields()).strip("\n"), ""]
    for spec in specs:
        heading, section = SECTIONS[spec["kind"]]
        lines = section(inp, rows, spec)
        if lines:
            out += ["## " + spec.get("heading", heading).format(**inp.fields()), "", *lines, ""]
    os.makedirs(os.path.dirname(os.path.abspath(inp.md)), exist_ok=True)
    with open(inp.md, "w") as fh:
        fh.write("\n".join(out))
    return rows
