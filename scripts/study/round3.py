"""Round 3 of the stale-data study: its plan, its numbers and its report.

Arms (scripts/study/arms.yaml): at the paper's regime ``s = S`` (chosen by the pilot: M2PO masks
about 1% of the tokens or less and clipped GRPO still loses against on-policy), clipped GRPO
(``grpo``), M2PO over all tokens (``m2po``) and M2PO over the trust-region quadrant tokens
(``m2po_tr``); at ``s = 16``, ``m2po_tr`` against round 2's arms. On-policy GRPO's three round-2
runs are the baseline of both. The rules are :mod:`study.verdicts_r3` (paired AUC difference).

The report is computed from the run directories alone (round 2's archive and round 3's work and
archive directories); only the text between the ``<!-- reading:start/end -->`` markers of an
existing report is written by hand and kept when it is regenerated.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from study import verdicts_r3 as V
from study.report import _block
from study.runs import discover, read_metrics
from study.summary import mean, paired_difference, stderr, summarise_arm, summarise_run

ONPOLICY = "grpo_onpolicy"
REGIME_ARMS = ("grpo", "m2po", "m2po_tr")
S16_ARMS = ("grpo", "m2po", "m2po_tr")
METRIC = {"grpo": "actor/clip_fraction", ONPOLICY: "actor/clip_fraction"}
LABEL = {
    ONPOLICY: "GRPO on-policy (s=0)",
    "grpo": "GRPO (clip 0.2)",
    "m2po": "M2PO, all tokens",
    "m2po_tr": "M2PO, trust-region tokens",
}
QUADRANT_KEYS = ("m2po/trust_region_fraction", "m2po/m2_before_trust_region")


@dataclass(frozen=True)
class Round3:
    """What round 3 covers: the regime's staleness, the seeds and the updates per run."""

    regime_staleness: int
    seeds: tuple[int, ...] = (1, 2, 3)
    steps: int = 40


def _quadrant_means(run_dir: str) -> dict[str, float]:
    """Mean over the updates with a learning signal of the quadrant statistics."""
    rows = [
        r
        for r in read_metrics(run_dir)
        if int(r.get("step", 0)) >= 1 and (r.get("actor/grad_norm") or 0.0) > 0.0
    ]
    return {k: mean([r.get(k) for r in rows]) for k in QUADRANT_KEYS}


def collect(roots: Sequence[str], plan: Round3) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Finished runs' rows per (arm, staleness), only the planned seeds."""
    found = discover(list(roots))
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for key, run_dir in sorted(found.items(), key=lambda kv: kv[0].name):
        if key.seed not in plan.seeds or not os.path.exists(os.path.join(run_dir, "done.json")):
            continue
        row = summarise_run(run_dir, key, plan.steps, METRIC.get(key.arm, "m2po/masked_fraction"))
        row.update(_quadrant_means(run_dir))
        out.setdefault((key.arm, key.staleness), []).append(row)
    return out


def _ready(rows: dict, plan: Round3, *cells: tuple[str, int]) -> bool:
    return all(len(rows.get(c, [])) == len(plan.seeds) >= 2 for c in cells)


def verdicts(rows: dict, plan: Round3) -> list[tuple[str, str, str]]:
    """(claim, verdict, numbers) for every round-3 claim; "pending" until its runs finished."""
    s = plan.regime_staleness
    on = (ONPOLICY, 0)

    def diff(a: tuple[str, int], b: tuple[str, int]) -> dict[str, Any]:
        return paired_difference(rows[a], rows[b], "auc_accuracy")

    claims: list[tuple[str, Any, tuple[str, int], tuple[str, int]]] = [
        (f"clipped GRPO loses accuracy at s={s}", V.loses, ("grpo", s), on),
        (f"M2PO (all tokens) keeps on-policy accuracy at s={s}", V.keeps, ("m2po", s), on),
        (
            f"M2PO (trust-region tokens) keeps on-policy accuracy at s={s}",
            V.keeps,
            ("m2po_tr", s),
            on,
        ),
        (f"M2PO (all tokens) beats clipped GRPO at s={s}", V.beats, ("m2po", s), ("grpo", s)),
        (f"M2PO (trust-region) beats clipped GRPO at s={s}", V.beats, ("m2po_tr", s), ("grpo", s)),
        (f"trust-region tokens beat all tokens at s={s}", V.beats, ("m2po_tr", s), ("m2po", s)),
        (
            "M2PO (trust-region tokens) keeps on-policy accuracy at s=16",
            V.keeps,
            ("m2po_tr", 16),
            on,
        ),
        ("M2PO (trust-region) beats clipped GRPO at s=16", V.beats, ("m2po_tr", 16), ("grpo", 16)),
        ("trust-region tokens beat all tokens at s=16", V.beats, ("m2po_tr", 16), ("m2po", 16)),
    ]
    out = []
    masked = [r["masked_or_clipped_fraction"] for r in rows.get(("m2po", s), [])]
    if _ready(rows, plan, ("m2po", s)):
        m = mean(masked)
        out.append(
            (
                f"s={s} is the paper's regime (M2PO masks at most 1% of the tokens)",
                V.in_paper_regime(m),
                f"M2PO (all tokens) masked {100 * m:.2f}% (standard error "
                f"{100 * stderr(masked):.2f})",
            )
        )
    for claim, rule, a, b in claims:
        if not _ready(rows, plan, a, b):
            out.append((claim, "pending", f"needs {plan.seeds} of {a} and {b}"))
            continue
        d = diff(a, b)
        out.append((claim, rule(d), V.describe(d)))
    return out


def _pm(x: float, se: float, scale: float = 100.0, digits: int = 1) -> str:
    if x != x:
        return ""
    return f"{scale * x:.{digits}f}" + ("" if se != se else f" ± {scale * se:.{digits}f}")


def arm_table(rows: dict, plan: Round3) -> list[str]:
    """The per-arm Markdown table (mean ± standard error over the finished seeds)."""
    head = (
        "| arm | s | seeds | final % | best % | AUC % | AUC - on-policy (paired) | masked or "
        "clipped % | m2 before masking (all) | m2 before masking (quadrants) | quadrant "
        "share % |"
    )
    lines = [head, "|" + "---|" * 11]
    cells = [(ONPOLICY, 0)]
    cells += [(a, plan.regime_staleness) for a in REGIME_ARMS]
    cells += [(a, 16) for a in S16_ARMS]
    for arm, s in cells:
        rs = rows.get((arm, s), [])
        if not rs:
            lines.append(f"| {LABEL[arm]} | {s} | 0 of {len(plan.seeds)} |" + " |" * 8)
            continue
        a = summarise_arm(rs)
        d = paired_difference(rs, rows.get((ONPOLICY, 0), []), "auc_accuracy")
        vs = (
            ""
            if arm == ONPOLICY or d["n"] < 2
            else f"{100 * d['mean']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"
        )
        quad = [mean([r[k] for r in rs]) for k in QUADRANT_KEYS]
        quad_se = [stderr([r[k] for r in rs]) for k in QUADRANT_KEYS]
        lines.append(
            f"| {LABEL[arm]} | {s} | {a['n']} of {len(plan.seeds)} | "
            f"{_pm(a['final_accuracy'], a['final_accuracy_se'])} | "
            f"{_pm(a['best_accuracy'], a['best_accuracy_se'])} | "
            f"{_pm(a['auc_accuracy'], a['auc_accuracy_se'])} | {vs} | "
            f"{_pm(a['masked_or_clipped_fraction'], a['masked_or_clipped_fraction_se'], 100, 2)} | "
            f"{_pm(a['m2_before'], a['m2_before_se'], 1, 3)} | "
            f"{_pm(quad[1], quad_se[1], 1, 3)} | {_pm(quad[0], quad_se[0], 100, 1)} |"
        )
    return lines


def write(roots: Sequence[str], plan: Round3, md: str, csv_path: str, command: str) -> int:
    """Write the round-3 Markdown and CSV; the number of finished runs summarised."""
    rows = collect(roots, plan)
    flat = [r for rs in rows.values() for r in rs]
    if flat:
        cols = list(flat[0].keys())
        with open(csv_path, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=cols)
            w.writeheader()
            w.writerows(flat)
    lines = [
        f"# Stale-data study, round 3: the paper's regime (s={plan.regime_staleness}) and the "
        "paper's final Algorithm 1",
        "",
        "Generated by `scripts/stale_study_round3.py` from the run directories; only the text "
        f"between the reading markers is written by hand. Regenerated with `{command}`.",
        "",
        "## Verdicts",
        "",
        "| claim | verdict | numbers (paired AUC difference) |",
        "|---|---|---|",
    ]
    lines += [f"| {c} | **{v}** | {n} |" for c, v, n in verdicts(rows, plan)]
    lines += ["", "Rules and power (fixed before the runs, `scripts/study/verdicts_r3.py`):", ""]
    lines += [_rules_text(), "", "## Results", ""]
    lines += arm_table(rows, plan)
    lines += ["", "## Reading", "", *_block(md, "reading"), ""]
    with open(md, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return len(flat)


def _rules_text() -> str:
    doc = V.__doc__ or ""
    return doc[doc.index("Primary measure") :].strip()
