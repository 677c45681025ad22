"""The training keys a resume changed (:mod:`areal_m2po.utils.config_changes`), on real configs."""

from __future__ import annotations

import json

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.utils.config_changes import (
    Change,
    changed_training_keys,
    config_record,
    describe,
    free_on_resume,
)


def _record(*overrides: str) -> dict:
    """The record of a PPO config with ``overrides``, through JSON as meta.json keeps it."""
    return json.loads(json.dumps(config_record(load_config(list(overrides), PPOConfig))))


def test_the_record_is_flat_json_without_secrets() -> None:
    record = _record("rollout.server_api_key=s3cret-key-0123456789")
    assert record["actor.optimizer.lr"] == 1e-5 and record["gconfig.n_samples"] == 8
    assert all(isinstance(k, str) and "api_key" not in k for k in record)
    assert "s3cret" not in json.dumps(record)


def test_training_keys_are_named_and_operational_keys_are_free() -> None:
    saved = _record()
    current = _record(
        "actor.optimizer.lr=2e-5",
        "actor.m2_threshold=0.1",
        "gconfig.max_new_tokens=32",
        "total_train_steps=50",
        "num_threads=1",
        "evaluator.freq_steps=3",
        "actor.mb_spec.max_tokens_per_mb=4096",
        "stats_logger.progress_bar=false",
    )
    changes = changed_training_keys(saved, current)
    assert changes == [
        Change("actor.optimizer.lr", 1e-5, 2e-5),
        Change("actor.m2_threshold", 0.04, 0.1),
        Change("gconfig.max_new_tokens", 16, 32),
    ]
    assert describe(changes) == (
        "actor.optimizer.lr 1e-05 -> 2e-05, actor.m2_threshold 0.04 -> 0.1, "
        "gconfig.max_new_tokens 16 -> 32"
    )
    assert changed_training_keys(saved, _record()) == []


def test_a_section_switched_on_or_off_is_a_change() -> None:
    off = {"teacher": None, "seed": 1}
    on = {"teacher.path": "x", "teacher.kl_coef": 0.1, "seed": 1}
    assert changed_training_keys(off, on) == [Change("teacher", None, "<set>")]
    assert changed_training_keys(on, off) == [Change("teacher", "<set>", None)]


def test_keys_one_version_lacks_are_not_compared() -> None:
    assert changed_training_keys({"a": 1}, {"a": 1, "b": 2}) == []
    assert changed_training_keys({"a": 1, "b": 2}, {"a": 1}) == []


def test_free_keys() -> None:
    assert free_on_resume("recover.mode") and free_on_resume("valid_dataset.path")
    assert free_on_resume("critic.mb_spec.n_mbs") and free_on_resume("rollout.vllm.python")
    assert not free_on_resume("actor.optimizer.lr") and not free_on_resume("seed")
    assert not free_on_resume("train_dataset.path") and not free_on_resume("reward.path")
    long = describe([Change("k", "x" * 100, 1)])
    assert long.startswith("k '" + "x" * 54) and "... -> 1" in long
