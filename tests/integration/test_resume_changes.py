"""What ``recover.allow_changed_keys=true`` changes on a resume (issue 57), on the tiny model in
this process: the new optimizer hyper-parameters are the ones trained with."""

from __future__ import annotations

import dataclasses

import pytest
from procs import read_metrics
from tiny_runs import make_cfg

from areal_m2po.api.cli_args import OptimizerConfig, RecoverConfig

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
