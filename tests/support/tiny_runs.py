"""The tiny training run the recover and trainer-state tests share, as a :class:`PPOConfig`
(``tests/support`` is on pytest's pythonpath)."""

from __future__ import annotations

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
