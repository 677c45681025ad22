"""On-policy distillation over two processes (``accelerate launch --multi_gpu``, gloo): the
teacher is sharded like the actor (FSDP2), scores each rank's own rollouts, and the reverse-KL
mean and its baseline are taken over both ranks (no hang, one metrics.jsonl)."""

from __future__ import annotations

import math

import pytest
from procs import check_exit, launch_command, popen, read_metrics, train_command
from teachers import save_tiny_teacher

pytestmark = pytest.mark.multiproc


def test_two_process_fsdp2_distillation_run(tmp_path):
    teacher = save_tiny_teacher(tmp_path / "teacher")
    out = tmp_path / "run"
    extra = (f"teacher.path={teacher}", "actor.backend=fsdp2", "teacher.kl_discount=0.5")
    check_exit([popen([*launch_command(2), *train_command(out, 2, *extra)], tmp_path)])
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["actor/loss"]) and r["distill/reverse_kl"] > 0
        assert r["timing/teacher_s"] > 0
