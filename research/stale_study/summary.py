"""The study's numbers: one row per run (from its metrics.jsonl), one per arm (mean and
standard error over seeds), and paired differences to the on-policy arm (same seed).

Accuracies are fractions in [0, 1]; a standard error over seeds is the sample standard
deviation over sqrt(n) (undefined with one seed); a 95% interval of a paired mean uses
Student's t with n - 1 degrees of freedom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .runs import RunKey, read_config, read_json, read_metrics, run_times

COLLAPSE_DEFINITION = (
    "collapsed = the last evaluation is below half the best evaluation of the run, or below the "
    "initial accuracy by more than 2 binomial standard errors of the initial accuracy on the "
    "eval set (2*sqrt(p0*(1-p0)/n))"
)
# the per-run measurements that are also averaged per arm
MEASURED = (
    "final_accuracy",
    "best_accuracy",
    "auc_accuracy",
    "masked_or_clipped_fraction",
    "behave_kl",
    "m2_before",
    "entropy_last5",
)
RUN_COLUMNS = (
    "arm",
    "staleness",
    "seed",
    *MEASURED,
    "collapsed",
    "initial_accuracy",
    "best_step",
    "steps_done",
    "steps_planned",
    "updates_with_signal",
    "eval_n",
    "mean_masked_fraction",
    "mean_clip_fraction",
    "mean_grad_norm",
    "max_grad_norm",
    "mean_reward_last5",
    "no_eos_last5",
    "wall_s",
    "cpu_s",
    "step_s_median",
    "eval_s_mean",
    "done",
    "run_dir",
)
# t_{0.975, df} for df = 1..10 (a two-sided 95% interval); 1.96 beyond
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def t975(df: int) -> float:
    return T975[df - 1] if 1 <= df <= len(T975) else 1.96


def mean(xs: Sequence[Any]) -> float:
    vals = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(vals) / len(vals) if vals else float("nan")


def median(xs: Sequence[Any]) -> float:
    vals = sorted(float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x))
    if not vals:
        return float("nan")
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def stderr(xs: Sequence[Any]) -> float:
    """Sample standard deviation / sqrt(n) of the finite values; nan below two values."""
    vals = [float(x) for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    if len(vals) < 2:
        return float("nan")
    m = sum(vals) / len(vals)
    return math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1) / len(vals))


def auc(evals: Sequence[tuple[int, float]], steps: int) -> float:
    """Area under the accuracy-vs-update curve (trapezoids between evaluations) divided by
    ``steps``: the mean accuracy over training, in [0, 1]; nan without evaluations at update 0
    and ``steps``."""
    pts = sorted(evals)
    if not pts or pts[0][0] != 0 or pts[-1][0] != steps or steps <= 0:
        return float("nan")
    area = sum((s1 - s0) * (a0 + a1) / 2 for (s0, a0), (s1, a1) in zip(pts, pts[1:]))
    return area / steps


def kl_key(config: dict[str, Any]) -> str:
    """The metric holding the behaviour-vs-proximal KL (k1, mean over valid tokens).

    With ``recompute_logprob`` the actor logs it as ``actor/behave_kl``. Without it the
    proximal policy is not computed; with one minibatch per batch the policy at the loss *is*
    the proximal policy, so ``actor/approx_kl`` (behave - current) is the same quantity.
    """
    actor = config.get("actor") or {}
    if actor.get("recompute_logprob", True):
        return "actor/behave_kl"
    return "actor/approx_kl"


def summarise_run(
    run_dir: str, key: RunKey, steps: int, metric: str, extra_metrics: Sequence[str] = ()
) -> dict[str, Any]:
    """One row of :data:`RUN_COLUMNS` (and of ``extra_metrics``) from ``run_dir``'s files only.

    ``metric`` is the arm's masked-or-clipped fraction key (``m2po/masked_fraction`` or
    ``actor/clip_fraction``). Fractions, KL, m2 and each of ``extra_metrics`` (logged metric
    names, a round's ``run_metrics``) are averaged over the updates with a learning signal
    (grad norm > 0): an update whose advantages are all zero clips and masks nothing.
    """
    records = read_metrics(run_dir)
    config = read_config(run_dir)
    evals = [(int(r["step"]), float(r["eval/accuracy"])) for r in records if "eval/accuracy" in r]
    train = [r for r in records if int(r.get("step", 0)) >= 1 and "actor/grad_norm" in r]
    row: dict[str, Any] = {k: "" for k in RUN_COLUMNS}
    row.update(arm=key.arm, staleness=key.staleness, seed=key.seed, run_dir=run_dir)
    row["steps_done"] = max((int(r["step"]) for r in train), default=0)
    row["steps_planned"] = int(config.get("total_train_steps") or steps)
    if evals:
        acc0 = next((a for s, a in evals if s == 0), evals[0][1])
        best_step, best = max(evals, key=lambda e: (e[1], -e[0]))
        n = max(float(r.get("eval/n", 0)) for r in records if "eval/accuracy" in r)
        row.update(initial_accuracy=acc0, final_accuracy=evals[-1][1], best_accuracy=best)
        row.update(best_step=best_step, eval_n=int(n))
        row["auc_accuracy"] = auc(evals, row["steps_planned"])
        margin = 2 * math.sqrt(acc0 * (1 - acc0) / n) if n else 0.0
        row["collapsed"] = bool(evals[-1][1] < 0.5 * best or evals[-1][1] < acc0 - margin)
    signal = [r for r in train if (r.get("actor/grad_norm") or 0.0) > 0.0]
    grad = [r.get("actor/grad_norm") for r in train]
    row["updates_with_signal"] = len(signal)
    row["mean_masked_fraction"] = mean([r.get("m2po/masked_fraction") for r in signal])
    row["mean_clip_fraction"] = mean([r.get("actor/clip_fraction") for r in signal])
    row["masked_or_clipped_fraction"] = mean([r.get(metric) for r in signal])
    row["behave_kl"] = mean([r.get(kl_key(config)) for r in signal])
    row["m2_before"] = mean([r.get("m2po/m2_before") for r in signal])
    for name in extra_metrics:
        row[name] = mean([r.get(name) for r in signal])
    row["mean_grad_norm"] = mean(grad)
    row["max_grad_norm"] = max((g for g in grad if g is not None), default=float("nan"))
    row["mean_reward_last5"] = mean([r.get("reward/mean") for r in train[-5:]])
    row["no_eos_last5"] = mean([r.get("rollout/no_eos_fraction") for r in train[-5:]])
    row["entropy_last5"] = mean([r.get("actor/entropy") for r in train[-5:]])
    row["step_s_median"] = median([r.get("timing/step_s") for r in train])
    row["eval_s_mean"] = mean([r.get("timing/eval_s") for r in records if "eval/accuracy" in r])
    info = read_json(f"{run_dir}/study_run.json") or {}
    row.update(run_times(info.get("attempts", [])))
    row["done"] = read_json(f"{run_dir}/done.json") is not None
    if not row["done"]:
        row["collapsed"] = ""  # judged on the last evaluation of a finished run only
    return row


ARM_STATS = (*MEASURED, "wall_s", "cpu_s")


def summarise_arm(
    rows: Sequence[dict[str, Any]], extra_metrics: Sequence[str] = ()
) -> dict[str, Any]:
    """Mean and standard error over the (finished) runs of one arm at one staleness, of
    :data:`ARM_STATS` and of the rows' ``extra_metrics``."""
    out: dict[str, Any] = {"n": len(rows), "seeds": sorted(int(r["seed"]) for r in rows)}
    for col in (*ARM_STATS, *extra_metrics):
        vals = [r[col] for r in rows]
        out[col] = mean(vals)
        out[col + "_se"] = stderr(vals)
    out["collapsed"] = sum(1 for r in rows if r["collapsed"] is True)
    return out


def paired_difference(
    rows: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]], col: str
) -> dict[str, Any]:
    """Mean, standard error and 95% t interval of ``row[col] - base[col]`` over the seeds both
    have (``n`` seeds; nan bounds below two)."""
    by_seed = {int(b["seed"]): b[col] for b in base}
    diffs = [
        float(r[col]) - float(by_seed[int(r["seed"])])
        for r in rows
        if int(r["seed"]) in by_seed
        and isinstance(r[col], (int, float))
        and isinstance(by_seed[int(r["seed"])], (int, float))
    ]
    m, se = mean(diffs), stderr(diffs)
    half = t975(len(diffs) - 1) * se if len(diffs) >= 2 else float("nan")
    return {"n": len(diffs), "mean": m, "se": se, "lo": m - half, "hi": m + half, "diffs": diffs}
