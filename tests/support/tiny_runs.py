"""The tiny training run the recover and trainer-state tests share, as a :class:`PPOConfig`
(``tests/support`` is on pytest's pythonpath)."""

from __future__ import annotations

import json
import os

from areal_m2po.api.cli_args import (
    ActorConfig,
    DatasetConfig,
    EvaluatorConfig,
    GenerationConfig,
    OptimizerConfig,
    PPOConfig,
    RecoverConfig,
    RewardConfig,
    RolloutConfig,
    SaverConfig,
    StatsLoggerConfig,
)


def make_cfg(tmp_path, name="run", steps=4, staleness=1, **kw) -> PPOConfig:
    """Four steps of the tiny model with M2PO, one step stale, recover checkpoints every step
    into ``tmp_path/name`` (``kw``: PPOConfig fields to replace)."""
    fields = dict(
        seed=5,
        output_dir=str(tmp_path / name),
        total_train_steps=steps,
        num_threads=1,
        actor=ActorConfig(
            path="builtin:tiny", m2_threshold=0.04, optimizer=OptimizerConfig(lr=3e-3)
        ),
        gconfig=GenerationConfig(n_samples=4, max_new_tokens=8),
        rollout=RolloutConfig(staleness=staleness),
        train_dataset=DatasetConfig(batch_size=4),
        valid_dataset=DatasetConfig(split="test", batch_size=8, max_samples=8, shuffle=False),
        reward=RewardConfig(path="toy_rewards:digit_fraction"),
        evaluator=EvaluatorConfig(freq_steps=None, eval_at_start=False, eval_at_end=False),
        saver=SaverConfig(save_at_end=False),
        recover=RecoverConfig(mode="auto", freq_steps=1, keep_last=2),
        stats_logger=StatsLoggerConfig(progress_bar=False),
    )
    fields.update(kw)
    return PPOConfig(**fields)


def tiny_overrides(run_dir, steps: int = 2, lr: float = 1e-2) -> list[str]:
    """Command-line overrides that shrink any shipped RL config to ``steps`` steps of the tiny
    model on the built-in arithmetic task with the dense toy reward: 4 prompts x 4 samples of
    at most 8 tokens, no evaluation, saves or recover checkpoints, writing to ``run_dir``.

    ``lr`` is large (1e-2) on purpose: one optimizer step moves the tiny policy far enough
    that a batch one version stale has ratios outside a 0.2 clip range and an m2 above 0.04,
    so every loss term that can act does."""
    return [
        f"output_dir={run_dir}",
        f"total_train_steps={steps}",
        "total_train_epochs=1",
        "num_threads=1",
        "actor.path=builtin:tiny",
        "actor.dtype=float32",
        "actor.gradient_checkpointing=false",
        f"actor.optimizer.lr={lr}",
        "actor.optimizer.warmup_steps_proportion=0",
        "tokenizer_path=null",
        "gconfig.n_samples=4",
        "gconfig.max_new_tokens=8",
        "train_dataset.path=builtin:arithmetic",
        "train_dataset.batch_size=4",
        "train_dataset.max_samples=64",
        "train_dataset.max_prompt_length=256",  # + 8 new tokens: within builtin:tiny's 512
        "valid_dataset.path=builtin:arithmetic",
        "valid_dataset.batch_size=8",
        "valid_dataset.max_prompt_length=256",
        "valid_dataset.max_samples=8",
        "reward.path=toy_rewards:digit_fraction",
        "evaluator.freq_steps=null",
        "evaluator.eval_at_start=false",
        "evaluator.eval_at_end=false",
        "saver.freq_steps=null",
        "saver.save_at_end=false",
        "recover.mode=disabled",
        "stats_logger.progress_bar=false",
        "stats_logger.wandb.mode=disabled",
    ]


def tiny_config(tmp_path, steps=3, staleness=0, reward="toy_rewards:digit_fraction", **actor_kw):
    """``steps`` steps of the tiny model with M2PO, ``staleness`` steps stale, evaluating and
    saving every 2 steps into ``tmp_path/run`` (``actor_kw``: ActorConfig fields to replace)."""
    actor = dict(
        path="builtin:tiny",
        m2_threshold=0.04,
        optimizer=OptimizerConfig(lr=3e-3),
    )
    actor.update(actor_kw)
    return PPOConfig(
        seed=3,
        output_dir=str(tmp_path / "run"),
        total_train_steps=steps,
        actor=ActorConfig(**actor),
        gconfig=GenerationConfig(n_samples=4, max_new_tokens=8),
        rollout=RolloutConfig(staleness=staleness),
        train_dataset=DatasetConfig(batch_size=4),
        valid_dataset=DatasetConfig(split="test", batch_size=8, max_samples=8, shuffle=False),
        reward=RewardConfig(path=reward),
        evaluator=EvaluatorConfig(freq_steps=2),
        saver=SaverConfig(freq_steps=2),
    )


def read_metrics(run_dir):
    """The rows of ``run_dir/metrics.jsonl``."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh if line.strip()]
