"""A round of the study, loaded from its rules file ``rounds/<name>.yaml`` (data, not code).

A round file holds what one round plans and how its report judges it:

* ``settings``: the round's own defaults of the command-line flags (``staleness``, ``arms``,
  ``seeds``, ``work_dir``, ...), over ``arms.yaml``'s shared ``defaults``;
* ``pilot``: the staleness pilot (``arm`` at each of ``staleness`` on the first seed), or none;
* ``rules``: ``margin`` (accuracy fraction), ``measure`` (the run column a paired claim
  compares, e.g. ``auc_accuracy``), ``equivalence`` (a "beats" claim whose interval lies inside
  (-margin, +margin) is "not reproduced (no difference as large as the margin)"), ``numbers``
  (the default text of a paired claim's numbers);
* ``claims``: each claim's text, rule (:data:`RULES`), the cells it compares and its texts;
* ``report``: output files, title, intro paragraphs, the table cells, arm labels, extra
  per-run metrics, and the sections in order (:mod:`.report`).

A cell is ``arm@s`` (the arm at the round's staleness) or ``arm@N`` (at staleness ``N``).
Texts are ``str.format`` templates over ``{s}``, ``{margin_pts}``, ``{command}``,
``{round_command}`` and, in a claim's numbers and notes, its own numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

ROUNDS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rounds")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RULES = ("loses", "keeps", "beats", "collapses", "masked_below", "masked_at_most")
PAIRED_RULES = ("loses", "keeps", "beats", "collapses")
COLUMN_VALUES = ("label", "s", "seeds", "collapsed", "minutes", "paired")
SECTION_KINDS = (
    "status",
    "verdicts",
    "results",
    "reading",
    "pilot",
    "every_run",
    "settings",
    "methods",
    "commands",
    "round1",
)


@dataclass(frozen=True)
class Cell:
    """An arm at a staleness (``None``: the round's staleness ``s``)."""

    arm: str
    staleness: int | None

    @classmethod
    def parse(cls, text: Any, where: str) -> Cell:
        arm, sep, s = str(text).partition("@")
        if not (arm and sep and (s == "s" or s.isdigit())):
            raise ValueError(f"{where}: {text!r} is not a cell 'arm@s' or 'arm@N'")
        return cls(arm, None if s == "s" else int(s))

    def at(self, s: int) -> tuple[str, int]:
        """``(arm, staleness)`` in a round at staleness ``s``."""
        return self.arm, s if self.staleness is None else self.staleness


@dataclass(frozen=True)
class Claim:
    """One claim of a round and how its verdict is reached (:mod:`.verdicts`)."""

    text: str
    rule: str
    arm: Cell
    baseline: Cell | None = None
    measure: str | None = None  # None: the round's rules.measure
    numbers: str | None = None  # None: the round's rules.numbers
    notes: dict[str, str] = field(default_factory=dict)  # verdict -> text appended
    max_fraction: float | None = None  # masked_below, masked_at_most

    def cells(self) -> tuple[Cell, ...]:
        return (self.arm,) if self.baseline is None else (self.arm, self.baseline)


@dataclass(frozen=True)
class Pilot:
    """The staleness pilot: ``arm`` at each of ``staleness`` on the round's first seed."""

    arm: str
    staleness: tuple[int, ...]


@dataclass(frozen=True)
class Round:
    """A round's plan, rules and report (see the module docstring)."""

    name: str
    path: str
    settings: dict[str, Any]
    pilot: Pilot | None
    margin: float
    measure: str
    equivalence: bool
    numbers: str
    claims: tuple[Claim, ...]
    report: dict[str, Any]
    cells: tuple[Cell, ...] | None  # the results table's cells (None: the plan's arms)
    labels: dict[str, str]
    run_metrics: tuple[str, ...]

    @property
    def commands_file(self) -> str:
        """The archived invocations that trained this round's runs (in the archive dir)."""
        return f"study_commands_{self.name}.txt"


def round_path(name_or_path: str) -> str:
    """``rounds/round<N>.yaml`` for ``N`` (or ``round<N>``), else the path as given."""
    name = str(name_or_path)
    if os.path.sep not in name and not name.endswith((".yaml", ".yml")):
        name = name if name.startswith("round") else f"round{name}"
        return os.path.join(ROUNDS_DIR, f"{name}.yaml")
    return name


def _check_keys(raw: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")
    return raw


def _claim(raw: Any, where: str) -> Claim:
    allowed = {"claim", "rule", "arm", "baseline", "measure", "numbers", "notes", "max_fraction"}
    raw = _check_keys(raw, allowed, where)
    if raw.get("rule") not in RULES:
        raise ValueError(f"{where}.rule: {raw.get('rule')!r} not in {RULES}")
    if not raw.get("claim") or "arm" not in raw:
        raise ValueError(f"{where}: needs 'claim' and 'arm'")
    paired = raw["rule"] in PAIRED_RULES
    if paired != ("baseline" in raw):
        raise ValueError(
            f"{where}: rule {raw['rule']} {'needs' if paired else 'takes no'} baseline"
        )
    if not paired and not isinstance(raw.get("max_fraction"), (int, float)):
        raise ValueError(f"{where}.max_fraction: rule {raw['rule']} needs a number")
    notes = _check_keys(raw.get("notes") or {}, {"reproduced", "not reproduced"}, f"{where}.notes")
    return Claim(
        text=str(raw["claim"]),
        rule=raw["rule"],
        arm=Cell.parse(raw["arm"], f"{where}.arm"),
        baseline=Cell.parse(raw["baseline"], f"{where}.baseline") if paired else None,
        measure=raw.get("measure"),
        numbers=raw.get("numbers"),
        notes={k: str(v) for k, v in notes.items()},
        max_fraction=raw.get("max_fraction"),
    )


def _pilot(raw: Any, where: str) -> Pilot | None:
    if raw is None:
        return None
    raw = _check_keys(raw, {"arm", "staleness"}, where)
    values = raw.get("staleness")
    if not isinstance(values, list) or not all(isinstance(v, int) and v >= 0 for v in values):
        raise ValueError(f"{where}.staleness: must be a list of integers >= 0")
    return Pilot(str(raw.get("arm")), tuple(values))


REPORT_KEYS = {"md", "csv", "png", "round1_csv", "title", "intro", "cells", "labels"}
REPORT_KEYS |= {"run_metrics", "sections"}


def load_round(name_or_path: str) -> Round:
    """The round of ``rounds/round<N>.yaml`` (``name_or_path`` = N) or of a YAML file.

    Raises:
        ValueError: a missing or malformed file, naming the file and the offending key.
    """
    import yaml

    path = round_path(name_or_path)
    if not os.path.exists(path):
        have = sorted(f[:-5] for f in os.listdir(ROUNDS_DIR) if f.endswith(".yaml"))
        raise ValueError(f"--round {name_or_path}: {path} does not exist (rounds: {have})")
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    top = {"settings", "pilot", "rules", "claims", "report"}
    data = _check_keys(data, top, path)
    rules = _check_keys(
        data.get("rules") or {}, {"margin", "measure", "equivalence", "numbers"}, f"{path}: rules"
    )
    report = _check_keys(data.get("report") or {}, REPORT_KEYS, f"{path}: report")
    for i, sec in enumerate(report.get("sections") or []):
        sec = {"kind": sec} if isinstance(sec, str) else sec
        where = f"{path}: report.sections[{i}]"
        if not isinstance(sec, dict) or sec.get("kind") not in SECTION_KINDS:
            raise ValueError(f"{where}: kind not in {SECTION_KINDS}")
        for j, col in enumerate(sec.get("columns", [])):
            if not isinstance(col, dict) or "header" not in col:
                raise ValueError(f"{where}.columns[{j}]: needs a header")
            if col.get("value") not in COLUMN_VALUES and "stat" not in col:
                raise ValueError(
                    f"{where}.columns[{j}]: needs a stat or a value in {COLUMN_VALUES}"
                )
        if "baseline" in sec:
            Cell.parse(sec["baseline"], f"{where}.baseline")
    settings = data.get("settings") or {}
    if not isinstance(settings, dict):  # its keys are the command line's flags (cli.py)
        raise ValueError(f"{path}: settings: expected a mapping of flag defaults")
    cells = report.get("cells")
    name = os.path.splitext(os.path.basename(path))[0]
    return Round(
        name=name,
        path=path,
        settings=settings,
        pilot=_pilot(data.get("pilot"), f"{path}: pilot"),
        margin=float(rules.get("margin", 0.05)),
        measure=str(rules.get("measure", "final_accuracy")),
        equivalence=bool(rules.get("equivalence", False)),
        numbers=str(rules.get("numbers", "{interval}")),
        claims=tuple(
            _claim(c, f"{path}: claims[{i}]") for i, c in enumerate(data.get("claims") or [])
        ),
        report=report,
        cells=None
        if cells is None
        else tuple(Cell.parse(c, f"{path}: report.cells") for c in cells),
        labels={str(k): str(v) for k, v in (report.get("labels") or {}).items()},
        run_metrics=tuple(report.get("run_metrics") or ()),
    )


def sections(rnd: Round) -> list[dict[str, Any]]:
    """The report's sections in order, each a mapping with at least ``kind``."""
    return [{"kind": s} if isinstance(s, str) else dict(s) for s in rnd.report.get("sections", [])]
