"""build_optimizer: the optimizer's hyperparameters and the LR schedule, checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.api.cli_args import OptimizerConfig
from areal_m2po.engine.optim import build_optimizer


def _lrs(optimizer: torch.optim.Optimizer, scheduler, steps: int) -> list[float]:
    """The learning rate used by each of ``steps`` optimizer steps."""
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_adamw_takes_the_config_and_only_trainable_params() -> None:
    trainable = torch.nn.Parameter(torch.zeros(3))
    frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
    cfg = OptimizerConfig(lr=3e-4, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1)
    optimizer, _ = build_optimizer(iter([trainable, frozen]), cfg, total_steps=5)
    assert isinstance(optimizer, torch.optim.AdamW)
    (group,) = optimizer.param_groups
    assert group["params"] == [trainable]
    assert group["betas"] == (0.8, 0.95)
    assert (group["eps"], group["weight_decay"], group["initial_lr"]) == (1e-6, 0.1, 3e-4)


def test_sgd_uses_beta1_as_momentum() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(type="sgd", lr=0.5, beta1=0.25, weight_decay=0.01)
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=3)
    assert isinstance(optimizer, torch.optim.SGD)
    (group,) = optimizer.param_groups
    assert (group["momentum"], group["weight_decay"]) == (0.25, 0.01)
    assert _lrs(optimizer, scheduler, 3) == [0.5, 0.5, 0.5]  # constant, no warm-up


def test_linear_schedule_with_warmup_by_hand() -> None:
    # 10 steps, warm-up round(0.2 * 10) = 2: lr * k / 2, then lr * (10 - k) / 8
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(lr=2.0, warmup_steps_proportion=0.2, lr_scheduler_type="linear")
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=10)
    want = [0.0, 1.0] + [2.0 * (10 - k) / 8 for k in range(2, 10)]
    assert _lrs(optimizer, scheduler, 10) == pytest.approx(want, abs=1e-12)


def test_cosine_schedule_by_hand() -> None:
    # warm-up round(0.25 * 8) = 2 steps, then 0.5 * (1 + cos(pi * (k - 2) / 6))
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(lr=1.0, warmup_steps_proportion=0.25, lr_scheduler_type="cosine")
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=8)
    want = [0.0, 0.5] + [0.5 * (1 + math.cos(math.pi * (k - 2) / 6)) for k in range(2, 8)]
    assert _lrs(optimizer, scheduler, 8) == pytest.approx(want, abs=1e-12)


def test_zero_total_steps_is_one_training_step() -> None:
    # a linear schedule over max(0, 1) = 1 step: the first step at full lr, then 0
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(lr=1.0, lr_scheduler_type="linear")
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=0)
    assert _lrs(optimizer, scheduler, 2) == [1.0, 0.0]


def test_constant_schedule_warms_up_linearly() -> None:
    # transformers' "constant" ignores num_warmup_steps; the config promises a linear warm-up
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(type="sgd", lr=1.0, warmup_steps_proportion=0.4)
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=10)  # 4 warm-up steps
    assert _lrs(optimizer, scheduler, 6) == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])


def test_constant_schedule_without_warmup_is_flat() -> None:
    p = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build_optimizer([p], OptimizerConfig(type="sgd", lr=0.3), 5)
    assert _lrs(optimizer, scheduler, 5) == pytest.approx([0.3] * 5)


def test_cosine_min_lr_ratio_is_areals_schedule_by_hand() -> None:
    # AReaL's get_cosine_schedule_with_warmup, r = 0.1, 2 warm-up steps of 8, lr 2.0:
    # warm-up r + (1 - r) k / 2 = 0.1, 0.55; then 0.1 + 0.45 (1 + cos(pi (k - 2) / 6))
    # k = 2: 1.0; k = 5: 0.1 + 0.45 = 0.55; k = 7: 0.1 + 0.45 (1 + cos(5 pi / 6)) = 0.160289...
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(
        lr=2.0, warmup_steps_proportion=0.25, lr_scheduler_type="cosine", min_lr_ratio=0.1
    )
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=8)
    lrs = _lrs(optimizer, scheduler, 8)
    assert lrs[:3] == pytest.approx([0.2, 1.1, 2.0], abs=1e-12)
    assert lrs[5] == pytest.approx(1.1, abs=1e-12)
    assert lrs[7] == pytest.approx(2.0 * (0.1 + 0.45 * (1 - math.sqrt(3) / 2)), abs=1e-12)
    assert lrs[7] == pytest.approx(0.3205771365940052, abs=1e-12)
    assert min(lrs) >= 0.2 - 1e-12  # never below min_lr_ratio * lr


def test_linear_min_lr_ratio_decays_to_the_floor_by_hand() -> None:
    # 10 steps, 2 warm-up: lr k / 2, then lr (0.25 + 0.75 (10 - k) / 8); the 11th step is
    # past the end: the floor 0.25 lr (not 0)
    p = torch.nn.Parameter(torch.zeros(1))
    cfg = OptimizerConfig(
        lr=4.0, warmup_steps_proportion=0.2, lr_scheduler_type="linear", min_lr_ratio=0.25
    )
    optimizer, scheduler = build_optimizer([p], cfg, total_steps=10)
    want = [0.0, 2.0] + [4.0 * (0.25 + 0.75 * (10 - k) / 8) for k in range(2, 11)]
    assert _lrs(optimizer, scheduler, 11) == pytest.approx(want, abs=1e-12)
    assert want[-1] == 1.0


def test_min_lr_ratio_out_of_range_is_refused() -> None:
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="min_lr_ratio"):
            OptimizerConfig(min_lr_ratio=bad)


def test_a_resume_takes_this_runs_hyperparameters_at_the_schedules_position() -> None:
    """Issue 57: loading a checkpoint's optimizer and scheduler state brought back its lr, betas,
    eps and weight decay; restore_schedule puts the new config's back, the schedule's step
    kept. Linear decay over 10 steps, no warm-up: at step 4 the factor is 1 - 4/10 = 0.6."""
    from areal_m2po.engine.optim import restore_schedule

    old = OptimizerConfig(lr=1e-3, lr_scheduler_type="linear", beta1=0.9, weight_decay=0.0)
    p = torch.nn.Parameter(torch.zeros(2))
    optimizer, scheduler = build_optimizer([p], old, total_steps=10)
    _lrs(optimizer, scheduler, 4)
    saved = (optimizer.state_dict(), scheduler.state_dict())

    new = OptimizerConfig(
        lr=2e-3, lr_scheduler_type="linear", beta1=0.5, beta2=0.9, eps=1e-5, weight_decay=0.1
    )
    q = torch.nn.Parameter(torch.zeros(2))
    optimizer, scheduler = build_optimizer([q], new, total_steps=10)
    optimizer.load_state_dict(saved[0])
    restore_schedule(optimizer, scheduler, saved[1], new)
    (group,) = optimizer.param_groups
    assert group["lr"] == pytest.approx(2e-3 * 0.6)
    assert scheduler.get_last_lr() == [pytest.approx(2e-3 * 0.6)]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.5, 0.9), 1e-5, 0.1)
    optimizer.step()
    scheduler.step()  # the next step: 1 - 5/10 of the new rate
    assert group["lr"] == pytest.approx(2e-3 * 0.5)
