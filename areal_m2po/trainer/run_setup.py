"""What every trainer does before it builds its parts (the start-up checks, threads, the
Accelerator, logging, the seed) and before its first step (the resolved ``config.yaml``), and
its metrics logger."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

import torch

from areal_m2po.trainer.node_check import check_processes_agree
from areal_m2po.trainer.preflight import check_config, check_output_dir
from areal_m2po.utils import dist
from areal_m2po.utils.config_changes import resume_note
from areal_m2po.utils.console import print_error, setup_logging
from areal_m2po.utils.host_memory import set_mmap_threshold
from areal_m2po.utils.run_lock import RunLock

logger = logging.getLogger("areal_m2po.trainer")

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
        lock: rank 0's hold on ``output_dir`` (:class:`~areal_m2po.utils.run_lock.RunLock`;
            None on other ranks), released when the trainer closes (or the process ends).
    """

    accelerator: Any
    is_main: bool
    rank: int
    world: int
    output_dir: str
    lock: RunLock | None = None


def start_run(config: Any) -> RunContext:
    """Set threads (``num_threads``) and, on CPU, glibc's mmap threshold
    (``host_mmap_threshold_mib``), start the Accelerator, set up logging and seed every RNG with
    ``seed``. ``config`` is any trainer's root config. The start-up checks run here in the
    order :mod:`areal_m2po.trainer.preflight` documents: packages, paths and the policy's
    positions first (:func:`~areal_m2po.trainer.preflight.check_config`), the output folder
    once the processes are known (:func:`~areal_m2po.trainer.preflight.check_output_dir`),
    then whether the processes agree
    (:func:`~areal_m2po.trainer.node_check.check_processes_agree`)."""
    check_config(config)
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    on_cpu = not torch.cuda.is_available()
    if on_cpu and config.host_mmap_threshold_mib is not None:
        set_mmap_threshold(config.host_mmap_threshold_mib)
    accelerator = Accelerator(cpu=on_cpu)
    setup_logging(accelerator.is_main_process)
    lock = None
    if accelerator.is_main_process:  # before the folder is judged: two runs cannot both pass
        lock = RunLock(config.output_dir)
        lock.acquire()
    with released_on_failure(lock):
        check_output_dir(config, dist.world_size())
        set_seed(config.seed)
        assert config.output_dir is not None  # filled in by the config's __post_init__
        check_processes_agree(config, config.output_dir)
    return RunContext(
        accelerator=accelerator,
        is_main=accelerator.is_main_process,
        rank=dist.rank(),
        world=dist.world_size(),
        output_dir=config.output_dir,
        lock=lock,
    )


@contextmanager
def released_on_failure(lock: RunLock | None) -> Iterator[None]:
    """Let ``lock`` go (rank 0's hold on the output folder) when the code inside raises: a
    start-up or a trainer that fails to build never reaches the trainer's ``close``."""
    try:
        yield
    except BaseException:
        if lock is not None:
            lock.release()
        raise


def write_run_config(config: Any, ctx: Any) -> None:
    """Rank 0 creates the output directory and writes the resolved config to ``config.yaml``.
    ``ctx``: the :class:`RunContext` (or the trainer: anything with ``is_main`` and
    ``output_dir``). A trainer calls it once every start-up check passed and a resumed
    checkpoint loaded, right before its first step, so the folder keeps describing its
    checkpoints until then. A resumed run's ``config.yaml`` starts with a comment naming the
    training keys it changed (``recover.allow_changed_keys``), after those of earlier
    resumes."""
    if ctx.is_main:
        os.makedirs(ctx.output_dir, exist_ok=True)
        from areal_m2po.api.config_loader import save_config

        path = os.path.join(ctx.output_dir, "config.yaml")
        header = ""
        if os.path.isfile(path) and not config.overwrite_output_dir:  # a resumed run
            with open(path, encoding="utf-8") as fh:
                header = resume_note(fh.read(), config)
        save_config(config, path, header)


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


def evaluation_note(config: Any, is_main: bool) -> str:
    """What the run evaluates on, for its start-up line: ``eval on <valid_dataset.path>
    (<split>)``, or ``no evaluation`` (no held-out set, or ``evaluator`` never due). When the
    training data are the user's and the held-out set is a built-in task, the main process
    also warns once that the evaluation measures that task."""
    valid = getattr(config, "valid_dataset", None)
    ev = config.evaluator
    if (
        valid is None
        or valid.path is None
        or not (ev.freq_steps or ev.eval_at_start or ev.eval_at_end)
    ):
        return "no evaluation"
    train = config.train_dataset.path
    builtin = "builtin:"
    if is_main and valid.path.startswith(builtin) and not str(train).startswith(builtin):
        logger.warning(
            "training on %s but evaluating on the built-in task %s (valid_dataset.path): the "
            "eval/ metrics measure that task; set valid_dataset.path to held-out data of "
            "your own, or %s to evaluate nothing",
            train,
            valid.path,
            no_evaluation_overrides(type(config)),
        )
    return f"eval on {valid.path} ({valid.split})"


def no_evaluation_overrides(config_cls: type) -> str:
    """The command-line overrides that turn a trainer's evaluation off, as its loader takes
    them: ``valid_dataset=null`` where that section may be null (SFT), else the evaluator's
    three cadences (PPO, whose held-out set is a required section)."""
    from areal_m2po.api.config_schema import fields_of

    if fields_of(config_cls)["valid_dataset"][1].optional:
        return "valid_dataset=null"
    return "evaluator.freq_steps=null evaluator.eval_at_start=false evaluator.eval_at_end=false"


def build_or_report(build: Callable[[Any], TrainerT], config: Any) -> TrainerT | None:
    """``build(config)``; on bad input found while building (a malformed dataset line, a
    module that does not import, an unknown model path: ValueError, OSError) print the one
    ``error:`` line and return None."""
    try:
        return build(config)
    except (ValueError, OSError) as exc:  # FileNotFoundError is an OSError
        print_error(exc)
        return None
