"""Plain-language verdicts on a round's claims, from paired differences over seeds.

Each rule is a function of the numbers and the round's parameters (its rules file,
:mod:`.rounds`); ``d`` is :func:`.summary.paired_difference` of the claim's measure (mean,
standard error and 95% Student-t interval over the seeds, accuracy fractions), ``margin`` an
accuracy fraction:

* ``loses``: reproduced when the interval lies below 0; not reproduced when its lower end is
  above -margin (a loss of the margin or more excluded); otherwise inconclusive.
* ``keeps`` (non-inferiority): reproduced when the lower end is above -margin; not reproduced
  when the interval lies below 0; otherwise inconclusive.
* ``beats``: reproduced when the interval lies above 0; not reproduced when it lies below 0;
  with ``equivalence``, "not reproduced (no difference as large as the margin)" when it lies
  inside (-margin, +margin); otherwise inconclusive.
* ``collapses``: not reproduced when no seed collapsed; reproduced when most seeds collapsed
  while the best accuracy stays within the margin of the baseline's best (``d`` on
  best accuracy); otherwise inconclusive.
* ``masked_below``: reproduced when the mean masked fraction plus 2 standard errors is below
  ``max_fraction``; not reproduced when the mean minus 2 standard errors is at or above it.
* ``masked_at_most``: "yes" when the mean masked fraction is at most ``max_fraction``, else "no".

A claim is judged only when every cell it involves has all the round's planned seeds finished
(and at least two); otherwise it is "pending".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .rounds import Claim, Round
from .summary import paired_difference, summarise_arm

INCONCLUSIVE = "inconclusive at this power"
Difference = dict[str, Any]  # summary.paired_difference: n, mean, se, lo, hi
Rows = dict[tuple[str, int], list[dict[str, Any]]]  # (arm, staleness) -> finished runs


@dataclass(frozen=True)
class Verdict:
    claim: str
    verdict: str  # reproduced | not reproduced... | inconclusive at this power | pending | yes | no
    because: str


def loses(d: Difference, margin: float) -> str:
    if d["hi"] < 0:
        return "reproduced"
    if d["lo"] > -margin:
        return "not reproduced"
    return INCONCLUSIVE


def keeps(d: Difference, margin: float) -> str:
    if d["lo"] > -margin:
        return "reproduced"
    if d["hi"] < 0:
        return "not reproduced"
    return INCONCLUSIVE


def beats(d: Difference, margin: float, equivalence: bool = False) -> str:
    if d["lo"] > 0:
        return "reproduced"
    if d["hi"] < 0:
        return "not reproduced"
    if equivalence and d["lo"] > -margin and d["hi"] < margin:
        return "not reproduced (no difference as large as the margin)"
    return INCONCLUSIVE


def collapses(arm: dict[str, Any], d_best: Difference, margin: float) -> str:
    if arm["collapsed"] == 0:
        return "not reproduced"
    if 2 * arm["collapsed"] >= arm["n"] and d_best["lo"] > -margin:
        return "reproduced"
    return INCONCLUSIVE


def masked_below(mean: float, se: float, max_fraction: float) -> str:
    if mean + 2 * se < max_fraction:
        return "reproduced"
    if mean - 2 * se >= max_fraction:
        return "not reproduced"
    return INCONCLUSIVE


def masked_at_most(mean: float, max_fraction: float) -> str:
    return "yes" if mean <= max_fraction else "no"


def interval(d: Difference) -> str:
    """``d`` in words: mean, standard error and 95% interval in points."""
    return (
        f"{100 * d['mean']:+.1f} points (standard error {100 * d['se']:.1f}, 95% interval "
        f"{100 * d['lo']:+.1f} to {100 * d['hi']:+.1f}, {d['n']} seeds)"
    )


def judge(claim: Claim, rnd: Round, rows: Rows, s: int) -> tuple[str, dict[str, Any]]:
    """``(verdict, numbers)`` of a claim whose cells are all finished: the numbers are the
    fields its texts can name (``interval``, ``collapsed``, ``n``, ``masked``, ``masked_se``,
    ``max``; percentages in points)."""
    arm = rows[claim.arm.at(s)]
    margin = rnd.margin
    if claim.baseline is None:
        a = summarise_arm(arm)
        m, se = a["masked_or_clipped_fraction"], a["masked_or_clipped_fraction_se"]
        assert claim.max_fraction is not None  # the round file's check
        numbers = {"masked": 100 * m, "masked_se": 100 * se, "max": 100 * claim.max_fraction}
        if claim.rule == "masked_at_most":
            return masked_at_most(m, claim.max_fraction), numbers
        return masked_below(m, se, claim.max_fraction), numbers
    d = paired_difference(arm, rows[claim.baseline.at(s)], claim.measure or rnd.measure)
    numbers = {"interval": interval(d)}
    if claim.rule == "collapses":
        a = summarise_arm(arm)
        numbers.update(collapsed=a["collapsed"], n=a["n"])
        return collapses(a, d, margin), numbers
    if claim.rule == "beats":
        return beats(d, margin, rnd.equivalence), numbers
    return (loses if claim.rule == "loses" else keeps)(d, margin), numbers


def verdicts(rnd: Round, rows: Rows, s: int, seeds: Sequence[int]) -> list[Verdict]:
    """Every claim of ``rnd`` at the round's staleness ``s``; "pending" until every seed of
    ``seeds`` (two at least) has finished in each of its cells. ``rows`` holds the finished
    runs of the planned seeds."""
    fields = {"s": s, "margin_pts": f"{100 * rnd.margin:.0f}"}
    out = []
    for claim in rnd.claims:
        text = claim.text.format(**fields)
        cells = [c.at(s) for c in claim.cells()]
        counts = {c: len(rows.get(c, [])) for c in cells}
        if len(seeds) < 2 or any(n < len(seeds) for n in counts.values()):
            waiting = ", ".join(
                f"{a} s={st} ({n} of {len(seeds)} seeds)" for (a, st), n in counts.items()
            )
            out.append(Verdict(text, "pending", f"waiting for {waiting}"))
            continue
        verdict, numbers = judge(claim, rnd, rows, s)
        because = (claim.numbers or rnd.numbers).format(**fields, **numbers)
        because += claim.notes.get(verdict, "").format(**fields, **numbers)
        out.append(Verdict(text, verdict, because))
    return out
