"""The optimizer and learning-rate schedule of a trainable model, built from its config."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from areal_m2po.api.cli_args import OptimizerConfig

__all__ = ["build_optimizer"]


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """An optimizer over the trainable (``requires_grad``) ``params`` and its LR scheduler (one
    scheduler step per optimizer step).

    ``type="adamw"``: AdamW with ``lr``, ``(beta1, beta2)``, ``eps`` and ``weight_decay``;
    ``type="sgd"``: SGD with momentum ``beta1`` and ``weight_decay``. The schedule is
    ``transformers.get_scheduler(lr_scheduler_type)`` with a linear warm-up over
    ``round(warmup_steps_proportion * total_steps)`` steps out of ``max(total_steps, 1)``;
    cosine with ``min_lr_ratio > 0`` is AReaL's (:func:`_cosine_with_floor`).
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
    warmup = int(round(config.warmup_steps_proportion * total_steps))
    if config.lr_scheduler_type == "cosine" and config.min_lr_ratio > 0:
        return optimizer, _cosine_with_floor(optimizer, warmup, max(total_steps, 1), config)
    # transformers' "constant" ignores num_warmup_steps; "constant_with_warmup" is the same
    # schedule with the warm-up the config promises (and equal to "constant" without one)
    schedule = config.lr_scheduler_type
    if schedule == "constant":
        schedule = "constant_with_warmup"
    scheduler = get_scheduler(
        schedule,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=max(total_steps, 1),
    )
    return optimizer, scheduler


def _cosine_with_floor(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, config: OptimizerConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """AReaL's cosine schedule with a floor ``m = min_lr_ratio``: the LR factor rises linearly
    from ``m`` to 1 over ``warmup`` steps, then follows ``m + (1 - m) (1 + cos(pi p)) / 2`` with
    ``p`` the fraction of the remaining ``total - warmup`` steps done."""
    floor = config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return floor + (1.0 - floor) * step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
