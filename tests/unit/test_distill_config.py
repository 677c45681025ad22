"""The ``teacher`` section: its one-line errors, and configs/distill.yaml being the built-in demo
plus a teacher (the distillation demo's comparison with RL rests on it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from areal_m2po.api.cli_args import ConfigError, TeacherConfig
from areal_m2po.api.config_loader import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_teacher_is_off_by_default_and_any_teacher_key_turns_it_on():
    assert load_config([]).teacher is None
    cfg = load_config(["teacher.path=builtin:tiny", "teacher.kl_discount=0.5"])
    assert cfg.teacher == TeacherConfig(path="builtin:tiny", kl_discount=0.5)
    assert (cfg.teacher.rl_loss_weight, cfg.teacher.distill_loss_weight) == (1.0, 1.0)
    assert cfg.teacher.center_reverse_kl


@pytest.mark.parametrize(
    "args, message",
    [
        (["teacher.dtype=bfloat16"], "teacher.path: must be set when the teacher section is on"),
        (["teacher.path="], "teacher.path: empty value (an unset shell variable?)"),
        (["teacher.path=t", "teacher.dtype=int8"], "teacher.dtype: must be one of"),
        (["teacher.path=t", "teacher.rl_loss_weight=-1"], "teacher.rl_loss_weight: must be >= 0"),
        (
            ["teacher.path=t", "teacher.rl_loss_weight=0", "teacher.distill_loss_weight=0"],
            "teacher.distill_loss_weight: rl_loss_weight and distill_loss_weight are both 0",
        ),
        (["teacher.path=t", "teacher.kl_discount=1.5"], "teacher.kl_discount: must be <= 1"),
        (
            ["teacher.path=t", "teacher.center_reverse_kl=3"],
            "teacher.center_reverse_kl: expected bool",
        ),
        (["teacher.path=t", "teacher.lora.r=8"], "teacher.lora.r: unknown key 'teacher.lora.r'"),
    ],
)
def test_bad_teacher_settings_are_refused_in_one_line(args, message):
    with pytest.raises(ConfigError) as err:
        load_config(args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_distill_yaml_is_the_demo_plus_a_teacher():
    """configs/distill.yaml changes only the run's name and length, the evaluation cadence and
    the teacher, so its curve compares with configs/default.yaml's RL run."""
    distill = load_config(["--config", str(CONFIGS / "distill.yaml")])
    default = load_config(["--config", str(CONFIGS / "default.yaml")])
    assert distill.teacher is not None
    assert distill.teacher.path == "outputs/m2po-arith/trial0/checkpoints/final"
    assert (distill.teacher.rl_loss_weight, distill.teacher.distill_loss_weight) == (0.0, 1.0)
    same = dataclasses.replace(
        distill,
        experiment_name=default.experiment_name,
        output_dir=default.output_dir,
        total_train_steps=default.total_train_steps,
        evaluator=default.evaluator,
        teacher=None,
    )
    assert same == default
