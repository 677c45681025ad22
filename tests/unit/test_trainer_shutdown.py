"""Every trainer (RL, SFT, reward model, DPO) ends through one shutdown, StepLoop.close: the loggers,
the accelerator's references, then ``dist.end_process_group`` (the RL trainer closes its
rollout side and reward runner first, even when the rollout side fails to close). The trainers
are built bare (``__new__``) with recording stand-ins for what close touches; nothing runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from areal_m2po.trainer.dpo_trainer import DPOTrainer
from areal_m2po.trainer.rl_trainer import RLTrainer
from areal_m2po.trainer.rw_trainer import RWTrainer
from areal_m2po.trainer.sft_trainer import SFTTrainer
from areal_m2po.utils import dist

SHUTDOWN = ["stats_logger", "accelerator.free_memory", "end_process_group"]


def _bare(cls: type, calls: list[str], rollout_fails: bool = False):
    def record(what: str):
        return lambda *_: calls.append(what)

    def failing_close() -> None:
        calls.append("rollout")
        raise RuntimeError("rollout close failed")

    trainer = cls.__new__(cls)
    trainer.stats_logger = SimpleNamespace(close=record("stats_logger"))
    trainer.accelerator = SimpleNamespace(free_memory=record("accelerator.free_memory"))
    trainer.rollout = SimpleNamespace(close=failing_close if rollout_fails else record("rollout"))
    trainer.reward_runner = SimpleNamespace(close=record("reward_runner"))
    return trainer


@pytest.mark.parametrize("cls", [SFTTrainer, RWTrainer, DPOTrainer])
def test_supervised_trainers_close_through_the_shared_shutdown(monkeypatch, cls):
    calls: list[str] = []
    monkeypatch.setattr(dist, "end_process_group", lambda: calls.append("end_process_group"))
    _bare(cls, calls).close()
    assert calls == SHUTDOWN


def test_rl_trainer_closes_its_rollout_then_the_shared_shutdown(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(dist, "end_process_group", lambda: calls.append("end_process_group"))
    _bare(RLTrainer, calls).close()
    assert calls == ["rollout", "reward_runner", *SHUTDOWN]
    calls.clear()
    with pytest.raises(RuntimeError, match="rollout close failed"):
        _bare(RLTrainer, calls, rollout_fails=True).close()
    assert calls == ["rollout", "reward_runner", *SHUTDOWN]
