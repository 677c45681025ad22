"""The run fields every trainer shares are declared and checked once (BaseExperimentConfig):
each root config starts with them, in one order, with one help text each, and only the
defaults of experiment_name and total_train_steps differ between trainers."""

from __future__ import annotations

import dataclasses

import pytest

from areal_m2po.api.cli_args import (
    BaseExperimentConfig,
    ConfigError,
    DPOConfig,
    PPOConfig,
    RWConfig,
    SFTConfig,
)

ROOTS = (PPOConfig, RWConfig, SFTConfig, DPOConfig)
RUN_KEYS = [f.name for f in dataclasses.fields(BaseExperimentConfig)]


def test_every_root_starts_with_the_run_fields_in_one_order() -> None:
    assert RUN_KEYS[0] == "experiment_name" and RUN_KEYS[-1] == "tokenizer_path"
    for cls in ROOTS:
        assert issubclass(cls, BaseExperimentConfig)
        assert [f.name for f in dataclasses.fields(cls)][: len(RUN_KEYS)] == RUN_KEYS


def test_only_two_defaults_differ_between_trainers() -> None:
    base = BaseExperimentConfig()
    for cls in ROOTS:
        cfg = cls()
        differs = {k for k in RUN_KEYS if getattr(cfg, k) != getattr(base, k)}
        assert differs <= {"experiment_name", "total_train_steps", "output_dir"}
        helps = {f.name: f.metadata["help"] for f in dataclasses.fields(cls) if f.name in RUN_KEYS}
        assert helps == {f.name: f.metadata["help"] for f in dataclasses.fields(base)}
    names = {cls().experiment_name for cls in ROOTS}
    assert names == {"m2po-arith", "rw", "sft", "dpo"}
    assert [cls().total_train_steps for cls in ROOTS] == [25, None, 30, None]


@pytest.mark.parametrize("cls", ROOTS)
def test_the_run_fields_are_checked_for_every_trainer(cls: type) -> None:
    with pytest.raises(ConfigError, match="^seed: must be >= 0"):
        cls(seed=-1)
    with pytest.raises(ConfigError, match="^host_mmap_threshold_mib: must be <= 32"):
        cls(host_mmap_threshold_mib=64)
    assert cls(experiment_name="e", trial_name="t").output_dir == "outputs/e/t"
