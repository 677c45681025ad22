"""What ``recover.allow_changed_keys=true`` changes on a resume (issue 57), on the tiny model in
this process: the new optimizer hyper-parameters are the ones trained with; what the checkpoint
itself carries on (the model, the optimizer's kind, the place in the data) is refused in one
line naming each such key."""

from __future__ import annotations

import dataclasses

import pytest
from procs import read_metrics
from tiny_runs import make_cfg

from areal_m2po.api.cli_args import DatasetConfig, OptimizerConfig, RecoverConfig

pytestmark = pytest.mark.usefixtures("restore_threads")


def _run(cfg) -> int:
    from areal_m2po.trainer.rl_trainer import run

    return run(cfg)


def test_a_resume_with_a_changed_lr_trains_at_the_new_lr(tmp_path) -> None:
    """It logged ``actor.optimizer.lr 0.003 -> 0.0005`` and went on at 0.003: the checkpoint's
    optimizer and scheduler state brought the old rate back (constant schedule here)."""
    first = make_cfg(tmp_path, steps=2, staleness=0)
    assert _run(first) == 0
    assert [m["actor/lr"] for m in read_metrics(first.output_dir)] == [3e-3, 3e-3]

    actor = dataclasses.replace(first.actor, optimizer=OptimizerConfig(lr=5e-4))
    recover = RecoverConfig(mode="auto", freq_steps=1, keep_last=2, allow_changed_keys=True)
    resumed = make_cfg(tmp_path, steps=3, staleness=0, actor=actor, recover=recover)
    assert _run(resumed) == 0
    lrs = [(m["step"], m["actor/lr"]) for m in read_metrics(first.output_dir)]
    assert lrs == [(1, 3e-3), (2, 3e-3), (3, 5e-4)]


def test_keys_the_checkpoint_carries_on_are_refused_even_when_allowed(tmp_path, capsys) -> None:
    """The help named data and model as changeable; a new batch size stopped on "PromptLoader
    state has batch_size=4" and a new optimizer type loaded AdamW state into SGD."""
    first = make_cfg(tmp_path, steps=1, staleness=0)
    assert _run(first) == 0
    capsys.readouterr()
    actor = dataclasses.replace(first.actor, optimizer=OptimizerConfig(type="sgd", lr=3e-3))
    recover = RecoverConfig(mode="auto", freq_steps=1, keep_last=2, allow_changed_keys=True)
    data = DatasetConfig(batch_size=8)
    again = make_cfg(
        tmp_path, steps=2, staleness=0, actor=actor, recover=recover, train_dataset=data
    )
    assert _run(again) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: ")]
    assert line.startswith("error: recover.mode: recover checkpoint ")
    assert (
        "was written with actor.optimizer.type 'adamw' -> 'sgd', train_dataset.batch_size "
        "4 -> 8, which cannot change on a resume, not even with recover.allow_changed_keys"
    ) in line
    assert [m["step"] for m in read_metrics(first.output_dir)] == [1]


@pytest.mark.parametrize(
    ("key", "fixed"),
    [
        ("actor.path", True),
        ("critic.path", True),
        ("model.path", True),
        ("actor.lora", True),
        ("model.lora.rank", True),
        ("critic.optimizer.type", True),
        ("train_dataset.path", True),
        ("seed", True),
        ("actor.optimizer.lr", False),
        ("actor.optimizer.beta2", False),
        ("reward.model.path", False),
        ("ref.path", False),
        ("valid_dataset.path", False),
    ],
)
def test_which_keys_a_resume_cannot_change(key, fixed) -> None:
    from areal_m2po.trainer.resume_check import fixed_on_resume

    assert fixed_on_resume(key) is fixed
