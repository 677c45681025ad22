"""The optimizer and learning-rate schedule of a trainable model, built from its config."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from areal_m2po.api.cli_args import OptimizerConfig

__all__ = ["apply_config", "build_optimizer", "lr_factor", "restore_schedule"]


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """An optimizer over the trainable (``requires_grad``) ``params`` and its LR scheduler (one
    scheduler step per optimizer step).

    ``type="adamw"``: AdamW with ``lr``, ``(beta1, beta2)``, ``eps`` and ``weight_decay``;
    ``type="sgd"``: SGD with momentum ``beta1`` and ``weight_decay``. The schedule is
    ``transformers.get_scheduler(lr_scheduler_type)`` with a linear warm-up over
    ``round(warmup_steps_proportion * total_steps)`` steps out of ``max(total_steps, 1)``;
    with ``min_lr_ratio > 0`` a cosine or linear schedule decays to ``min_lr_ratio * lr``
    instead (:func:`lr_factor`).
    """
    from transformers import get_scheduler

    trainable = [p for p in params if p.requires_grad]
    if config.type == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            trainable,
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
    else:
        optimizer = torch.optim.SGD(
            trainable, lr=config.lr, momentum=config.beta1, weight_decay=config.weight_decay
        )
    # transformers' "constant" ignores num_warmup_steps; "constant_with_warmup" is the same
    # schedule with the warm-up the config promises (and equal to "constant" without one)
    schedule = config.lr_scheduler_type
    if schedule == "constant":
        schedule = "constant_with_warmup"
    warmup = int(round(config.warmup_steps_proportion * total_steps))
    if config.min_lr_ratio > 0 and schedule in ("cosine", "linear"):
        kind, ratio, total = schedule, config.min_lr_ratio, max(total_steps, 1)
        scheduler: torch.optim.lr_scheduler.LRScheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(kind, step, warmup, total, ratio)
        )
    else:
        scheduler = get_scheduler(
            schedule, optimizer, num_warmup_steps=warmup, num_training_steps=max(total_steps, 1)
        )
    return optimizer, scheduler


def restore_schedule(
    optimizer: torch.optim.Optimizer | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    state: dict[str, Any] | None,
    config: OptimizerConfig,
) -> None:
    """Load a recover checkpoint's scheduler ``state`` (if any) into ``scheduler``, after the
    optimizer's state was loaded, then put this run's hyper-parameters back
    (:func:`apply_config`): both states carry the checkpoint's. No-op without an optimizer."""
    if scheduler is not None and state is not None:
        scheduler.load_state_dict(state)
    if optimizer is not None:
        apply_config(optimizer, scheduler, config)


def apply_config(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    config: OptimizerConfig,
) -> None:
    """Set ``config``'s ``lr``, ``weight_decay`` and ``(beta1, beta2)``, ``eps`` (AdamW) or
    momentum ``beta1`` (SGD) into every param group, and ``lr`` as the scheduler's base rate,
    keeping the schedule's position: the current rate becomes ``lr`` times the schedule's
    factor at the scheduler's step. Loading an optimizer's or scheduler's state brings back the
    values it was saved with; a resume that changed them calls this after loading."""
    for group in optimizer.param_groups:
        group["initial_lr"] = config.lr
        group["weight_decay"] = config.weight_decay
        if "betas" in group:
            group["betas"] = (config.beta1, config.beta2)
            group["eps"] = config.eps
        elif "momentum" in group:
            group["momentum"] = config.beta1
    groups = optimizer.param_groups
    if scheduler is None:
        for group in groups:
            group["lr"] = config.lr
        return
    scheduler.base_lrs = [config.lr for _ in groups]
    factors = getattr(scheduler, "lr_lambdas", None)
    step = scheduler.last_epoch
    for i, group in enumerate(groups):
        group["lr"] = config.lr * (factors[i](step) if factors else 1.0)
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() answers


def lr_factor(kind: str, step: int, warmup: int, total: int, min_lr_ratio: float) -> float:
    """The learning rate of optimizer step ``step`` (0-based) as a fraction of ``lr``, for a
    decay to ``r = min_lr_ratio`` over ``total`` steps after ``warmup`` warm-up steps.

    cosine (AReaL's FSDP engine, ``get_cosine_schedule_with_warmup``): warm-up
    ``r + (1 - r) * step / warmup``, then ``max(r, r + (1 - r) * (1 + cos(pi * p)) / 2)`` with
    ``p = (step - warmup) / max(1, total - warmup)``. linear (AReaL's Megatron engine, which
    decays to ``min_lr_ratio * lr``): warm-up ``step / warmup``, then
    ``r + (1 - r) * max(0, 1 - p)``. With ``r = 0`` both are transformers' schedules.
    """
    progress = (step - warmup) / max(1, total - warmup)
    if kind == "cosine":
        if step < warmup:
            return min_lr_ratio + (1.0 - min_lr_ratio) * step / max(1, warmup)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(min_lr_ratio, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)
    if step < warmup:
        return step / max(1, warmup)
    return min_lr_ratio + (1.0 - min_lr_ratio) * max(0.0, 1.0 - progress)
