"""What every trainer does before it builds its parts: threads, the Accelerator, logging, the
seed, the output directory with the resolved ``config.yaml``, and the metrics logger."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

from areal_m2po.trainer.node_check import check_processes_agree
from areal_m2po.trainer.preflight import check_extras
from areal_m2po.utils import dist
from areal_m2po.utils.console import print_error, setup_logging
from areal_m2po.utils.host_memory import set_mmap_threshold

TrainerT = TypeVar("TrainerT")

EXIT_BAD_INPUT = 2
"""Exit status of a run stopped by bad input before training (config, data, model path)."""


@dataclass
class RunContext:
    """The process's place in the run.

    Attributes:
        accelerator: the run's ``accelerate.Accelerator`` (CPU when no CUDA device is present).
        is_main: whether this is rank 0 (it writes files and logs at INFO).
        rank: this process's rank; world: the number of processes.
        output_dir: the run's output directory (created by rank 0).
    """

    accelerator: Any
    is_main: bool
    rank: int
    world: int
    output_dir: str


def start_run(config: Any) -> RunContext:
    """Set threads (``num_threads``) and, on CPU, glibc's mmap threshold
    (``host_mmap_threshold_mib``), start the Accelerator, set up logging and seed every RNG with
    ``seed``. ``config`` is a root config (``PPOConfig``, ``RWConfig`` or ``SFTConfig``); a
    feature it asks for whose optional packages are missing is refused first
    (:func:`~areal_m2po.trainer.preflight.check_extras`), and processes that disagree on the
    config, the files it names, package versions or the checkpoint to resume, or that do not
    share ``output_dir``, are stopped in one line
    (:func:`~areal_m2po.trainer.node_check.check_processes_agree`)."""
    check_extras(config)
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    on_cpu = not torch.cuda.is_available()
    if on_cpu and config.host_mmap_threshold_mib is not None:
        set_mmap_threshold(config.host_mmap_threshold_mib)
    accelerator = Accelerator(cpu=on_cpu)
    setup_logging(accelerator.is_main_process)
    set_seed(config.seed)
    assert config.output_dir is not None  # filled in by the config's __post_init__
    check_processes_agree(config, config.output_dir)
    return RunContext(
        accelerator=accelerator,
        is_main=accelerator.is_main_process,
        rank=dist.rank(),
        world=dist.world_size(),
        output_dir=config.output_dir,
    )


def write_run_config(config: Any, ctx: RunContext) -> None:
    """Rank 0 creates the output directory and writes the resolved config to ``config.yaml``."""
    if ctx.is_main:
        os.makedirs(ctx.output_dir, exist_ok=True)
        from areal_m2po.api.config_loader import save_config

        save_config(config, os.path.join(ctx.output_dir, "config.yaml"))


def make_stats_logger(config: Any, ctx: RunContext) -> Any:
    """The run's :class:`~areal_m2po.utils.stats_logger.StatsLogger` (``metrics.jsonl``, console,
    wandb as ``config.stats_logger`` says), named ``experiment_name/trial_name``."""
    from areal_m2po.utils.stats_logger import StatsLogger

    return StatsLogger(
        config.stats_logger,
        ctx.output_dir,
        f"{config.experiment_name}/{config.trial_name}",
        asdict(config),
        is_main=ctx.is_main,
    )


def build_or_report(build: Callable[[Any], TrainerT], config: Any) -> TrainerT | None:
    """``build(config)``; on bad input found while building (a malformed dataset line, a
    module that does not import, an unknown model path: ValueError, OSError) print the one
    ``error:`` line and return None."""
    try:
        return build(config)
    except (ValueError, OSError) as exc:  # FileNotFoundError is an OSError
        print_error(exc)
        return None
