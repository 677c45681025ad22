"""Round 3's verdict rules, fixed before its study runs (the staleness pilot excepted).

Round 3 asks two questions (docs/stale_study_round3.md):

1. In the paper's regime (the second moment near the threshold: M2PO masks about 1% of the
   tokens or less) does M2PO keep the on-policy accuracy that clipped GRPO loses?
2. Does the paper's final Algorithm 1 (``actor.m2_token_set=trust_region``: only tokens in PPO's
   active trust-region quadrants are candidates) behave differently from AReaL's all-token rule?

Primary measure: the **paired AUC difference** (area under the held-out accuracy curve over the
40 updates, i.e. the mean accuracy over training; paired by seed, the seeds share the initial
policy, the data order and the evaluation set). Round 2 showed that the final accuracy of one
evaluation cannot resolve 15 points with 3 seeds (its paired standard errors were 3-10 points),
while AUC differences had standard errors of 0.6-2 points. Final and best accuracy are reported
beside it, never used by a rule.

Rules (``d`` is the paired AUC difference, mean and 95% Student-t interval over seeds, in
accuracy fractions; MARGIN = 3 points of AUC):

* "X loses against on-policy": reproduced when the interval lies below 0; not reproduced when its
  lower end is above -MARGIN (a loss of MARGIN or more excluded); otherwise inconclusive.
* "X keeps on-policy accuracy" (non-inferiority): reproduced when the lower end is above -MARGIN;
  not reproduced when the interval lies below 0; otherwise inconclusive.
* "X beats Y": reproduced when the interval lies above 0; not reproduced when it lies below 0;
  otherwise inconclusive ("no difference as large as MARGIN" when the interval lies inside
  (-MARGIN, +MARGIN)).
* "the regime is the paper's": M2PO (all tokens) masks at most ``REGIME_MASKED_FRACTION`` (1%) of
  the tokens, averaged over the updates with a learning signal and over seeds.

A claim is judged only when every arm it involves has all its planned seeds finished (at least
two); otherwise it is "pending".

Power: with 3 seeds the 95% interval is the mean +- 4.30 standard errors of the paired mean.
Round 2's paired AUC standard errors (0.6-2.0 points) give half-widths of 2.6-8.6 points: a
3-point non-inferiority margin can only be shown when the true difference is near 0 and the
seeds agree (standard error under ~0.7 points); a difference of 5 points or more is resolved
when the standard error is under ~1.2 points. Differences smaller than that are reported as
inconclusive, not as equal.
"""

from __future__ import annotations

from typing import Any

MARGIN_AUC = 0.03  # accuracy fraction: 3 points of AUC
REGIME_MASKED_FRACTION = 0.01  # "the paper's regime": M2PO masks at most 1% of the tokens

Difference = dict[str, Any]  # study.summary.paired_difference: n, mean, se, lo, hi


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def describe(d: Difference, what: str = "AUC") -> str:
    """``d`` in words: mean, standard error and 95% interval in points."""
    return (
        f"{what} {_pts(d['mean'])} points (standard error {100 * d['se']:.1f}, 95% interval "
        f"{_pts(d['lo'])} to {_pts(d['hi'])}, {d['n']} seeds)"
    )


def loses(d: Difference) -> str:
    """Verdict on "the arm loses accuracy against its baseline"."""
    if d["hi"] < 0:
        return "reproduced"
    if d["lo"] > -MARGIN_AUC:
        return "not reproduced"
    return "inconclusive at this power"


def keeps(d: Difference) -> str:
    """Verdict on "the arm keeps its baseline's accuracy" (non-inferiority at MARGIN_AUC)."""
    if d["lo"] > -MARGIN_AUC:
        return "reproduced"
    if d["hi"] < 0:
        return "not reproduced"
    return "inconclusive at this power"


def beats(d: Difference) -> str:
    """Verdict on "the arm ends above its comparison"."""
    if d["lo"] > 0:
        return "reproduced"
    if d["hi"] < 0:
        return "not reproduced"
    if d["lo"] > -MARGIN_AUC and d["hi"] < MARGIN_AUC:
        return "not reproduced (no difference as large as the margin)"
    return "inconclusive at this power"


def in_paper_regime(masked_fraction: float) -> str:
    """Verdict on "M2PO (all tokens) masks at most 1% of the tokens at this staleness"."""
    return "yes" if masked_fraction <= REGIME_MASKED_FRACTION else "no"
