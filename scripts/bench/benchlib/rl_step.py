"""Figure ``rl_step_breakdown``: ``RLTrainer.train`` for a few steps (staleness 1 so the
proximal log-probs are recomputed, ``kl_ctl`` > 0 so the reference model runs), its phases in %
of the summed wall time, and completion tokens per second; the step stats come through a step
callback."""

from __future__ import annotations

import tempfile

from areal_m2po.api.callbacks import StepCallback
from areal_m2po.api.config_loader import load_config
from areal_m2po.trainer.rl_trainer import RLTrainer
from benchlib.models import ModelSpec


class StepStats(StepCallback):
    """Every step's stats, in order (as the trainer hands them to the logger)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def on_step_end(self, step: int, stats: dict[str, float]) -> None:
        self.rows.append(stats)


def rl_breakdown(
    spec: ModelSpec, steps: int, threads: int, n_prompts: int, n_samples: int, max_new: int
) -> dict[str, float]:
    """Shares of the summed step time of ``RLTrainer`` steps (staleness 1, KL reference on)."""
    out_dir = tempfile.mkdtemp(prefix="bench-rl-")
    overrides = [
        f"output_dir={out_dir}",
        f"total_train_steps={steps}",
        f"num_threads={threads}",
        f"actor.path={spec.path}",
        f"ref.path={spec.path}",
        "actor.m2_threshold=0.04",
        "actor.kl_ctl=0.01",
        "actor.optimizer.lr=1e-6",
        f"gconfig.n_samples={n_samples}",
        f"gconfig.max_new_tokens={max_new}",
        "rollout.staleness=1",
        f"train_dataset.batch_size={n_prompts}",
        "valid_dataset.max_samples=8",
        "evaluator.freq_steps=null",
        "evaluator.eval_at_start=false",
        "evaluator.eval_at_end=false",
        "saver.save_at_end=false",
        "stats_logger.jsonl=false",
        "stats_logger.console=false",
        "stats_logger.progress_bar=false",
    ]
    cfg = load_config(overrides)
    steps_seen = StepStats()
    trainer = RLTrainer(cfg, callbacks=[steps_seen])
    rows = steps_seen.rows
    try:
        trainer.train()
    finally:
        trainer.close()
    # with staleness 1 the batch trained at step j was generated during step j - 1, and its
    # generation time is logged with it: the generation done inside step j is in rows[j + 1].
    # The first step (warm-up) and the last (its generation is never logged) are left out.
    if len(rows) < 3:
        raise SystemExit("--rl-steps must be at least 3")
    timed = rows[1:-1]
    gens = rows[2:]

    def total(key: str, src: list[dict[str, float]] = timed) -> float:
        return sum(r.get(key, 0.0) for r in src)

    # shares of the summed step time (additive, unlike medians of the parts)
    step_s = total("timing/step_s")
    # the rewards are scored inside each episode, within the generation's wall time
    # (timing/reward_s sums them over episodes): adding them would count them twice
    gen = total("timing/gen_s", gens)
    prox, ref, upd = total("timing/prox_s"), total("timing/ref_s"), total("timing/update_s")
    other = step_s - gen - prox - ref - upd
    n_seq = n_prompts * n_samples
    tokens = sum(r.get("rollout/gen_len_mean", 0.0) * n_seq for r in gens)
    return {
        "step_s": step_s / len(timed),
        "gen_pct": 100 * gen / step_s,
        "logprob_pct": 100 * prox / step_s,
        "ref_pct": 100 * ref / step_s,
        "update_pct": 100 * upd / step_s,
        "other_pct": 100 * other / step_s,
        "completion_tok_per_s": tokens / step_s,
    }
