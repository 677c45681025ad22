"""Plain-language verdicts on the paper's claims, from paired differences over seeds.

The rules (stated in the report too): a claim is judged only when every arm it involves has
all its planned seeds finished (and at least two); a difference is "significant" when its 95%
paired t interval excludes 0; a loss "larger than MARGIN is excluded" when the interval's lower
end is above -MARGIN (half of the paper's own GRPO drop, 50.7 -> 40.1 points at s=256).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MARGIN = 0.05  # accuracy fraction: 5 points
PAPER_MASKED_FRACTION = 0.0006  # the paper: M2PO masks 0.06% of the tokens


@dataclass(frozen=True)
class Verdict:
    claim: str
    verdict: str  # reproduced | not reproduced | inconclusive at this power | pending
    because: str


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def _interval(d: dict[str, Any]) -> str:
    return (
        f"{_pts(d['mean'])} points (standard error {100 * d['se']:.1f}, 95% interval "
        f"{_pts(d['lo'])} to {_pts(d['hi'])}, {d['n']} seeds)"
    )


def grpo_degrades(d: dict[str, Any]) -> tuple[str, str]:
    """GRPO (clip) at staleness s ends below on-policy GRPO."""
    why = f"final accuracy GRPO - on-policy: {_interval(d)}"
    if d["hi"] < 0:
        return "reproduced", why
    if d["lo"] > -MARGIN:
        return "not reproduced", why + f"; a drop larger than {100 * MARGIN:.0f} points is excluded"
    return "inconclusive at this power", why


def noclip_collapses(arm: dict[str, Any], d_best: dict[str, Any]) -> tuple[str, str]:
    """GRPO without a trust region prospers (its best is near on-policy), then collapses."""
    why = (
        f"collapsed in {arm['collapsed']} of {arm['n']} seeds; best accuracy vs on-policy's "
        f"best: {_interval(d_best)}"
    )
    if arm["collapsed"] == 0:
        return "not reproduced", why
    if 2 * arm["collapsed"] >= arm["n"] and d_best["lo"] > -MARGIN:
        return "reproduced", why
    return "inconclusive at this power", why


def m2po_matches_onpolicy(d: dict[str, Any]) -> tuple[str, str]:
    """M2PO at staleness s loses no more than MARGIN against on-policy GRPO (non-inferiority)."""
    why = f"final accuracy M2PO - on-policy: {_interval(d)}"
    if d["lo"] > -MARGIN:
        return "reproduced", why + f"; a loss larger than {100 * MARGIN:.0f} points is excluded"
    if d["hi"] < 0:
        return "not reproduced", why + "; significantly below on-policy"
    return "inconclusive at this power", why


def m2po_beats_grpo(d: dict[str, Any]) -> tuple[str, str]:
    """M2PO at staleness s ends above GRPO (clip) at the same staleness."""
    why = f"final accuracy M2PO - GRPO (same s, same seed): {_interval(d)}"
    if d["lo"] > 0:
        return "reproduced", why
    if d["hi"] < 0:
        return "not reproduced", why + "; significantly below GRPO"
    return "inconclusive at this power", why


def masked_fraction_small(arm: dict[str, Any]) -> tuple[str, str]:
    """M2PO masks a fraction of the tokens of the paper's order (0.06%; here: below 10x)."""
    m, se = arm["masked_or_clipped_fraction"], arm["masked_or_clipped_fraction_se"]
    why = (
        f"masked {100 * m:.2f}% of the tokens (standard error {100 * se:.2f}) vs the paper's "
        f"{100 * PAPER_MASKED_FRACTION:.2f}%"
    )
    bound = 10 * PAPER_MASKED_FRACTION
    if m + 2 * se < bound:
        return "reproduced", why + f" (below {100 * bound:.1f}%, within 10x)"
    if m - 2 * se >= bound:
        return "not reproduced", why + f" (more than 10x the paper's, {100 * bound:.1f}%)"
    return "inconclusive at this power", why


Rule = Callable[..., tuple[str, str]]


def judge(claim: str, ready: bool, missing: str, rule: Rule, *args: Any) -> Verdict:
    """The verdict of ``rule(*args)``, or "pending" while the runs it needs are unfinished."""
    if not ready:
        return Verdict(claim, "pending", missing)
    verdict, why = rule(*args)
    return Verdict(claim, verdict, why)
