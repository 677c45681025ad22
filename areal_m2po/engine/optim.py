"""The optimizer and learning-rate schedule of a trainable model, built from its config."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from areal_m2po.api.cli_args import OptimizerConfig

__all__ = ["build_optimizer", "lr_factor"]


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
