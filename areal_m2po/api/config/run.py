"""The run fields every trainer's root config shares (names, seed, output folder, length of the
run, threads, tokenizer) and their checks."""

from __future__ import annotations

from typing import Any

from areal_m2po.api.config.checks import (
    check_bool,
    check_nonempty_str,
    check_number,
    check_str,
    config_field,
)

HOST_MMAP_THRESHOLD_MIB = 1
"""Default ``host_mmap_threshold_mib`` of the root configs."""


def host_mmap_threshold_field() -> Any:
    """The ``host_mmap_threshold_mib`` key every root config (PPO, reward model, SFT) has."""
    return config_field(
        HOST_MMAP_THRESHOLD_MIB,
        "CPU runs on glibc (Linux): host blocks of at least this many MiB get their own mmap and "
        "go back to the OS when freed (mallopt M_MMAP_THRESHOLD, 1-32), so the activations one "
        "micro-batch frees do not stay resident beside the next; null: glibc's default (a "
        "threshold it raises itself up to 32 MiB). Not applied when CUDA is used "
        "(docs/performance.md, memory).",
    )


def check_run_fields(run: Any) -> None:
    """Check the keys every root config shares (names, seed, output_dir, length of the run,
    threads, tokenizer) and derive ``output_dir`` from the names when it is null."""
    for name in ("experiment_name", "trial_name"):
        check_nonempty_str(name, getattr(run, name))
    check_number("seed", run.seed, ge=0, integer=True)
    check_nonempty_str(
        "output_dir", run.output_dir, optional=True, null_means="derives it from the names"
    )
    if run.output_dir is None:
        run.output_dir = f"outputs/{run.experiment_name}/{run.trial_name}"
    check_bool("overwrite_output_dir", run.overwrite_output_dir)
    check_number("total_train_epochs", run.total_train_epochs, ge=1, integer=True)
    check_number("total_train_steps", run.total_train_steps, ge=1, integer=True, optional=True)
    check_number("num_threads", run.num_threads, ge=1, integer=True, optional=True)
    check_number(
        "host_mmap_threshold_mib",
        run.host_mmap_threshold_mib,
        ge=1,
        le=32,
        integer=True,
        optional=True,
    )
    check_str("tokenizer_path", run.tokenizer_path, optional=True)


def overwrite_output_dir_field() -> Any:
    """The ``overwrite_output_dir`` key every root config has."""
    return config_field(
        False,
        "Replace the run already in output_dir and start afresh: metrics.jsonl starts empty, "
        "its recover checkpoints are deleted at this run's first one, saved models are "
        "replaced tag by tag. Without it a folder holding a run (metrics.jsonl, checkpoints/, "
        "recover/) is resumed (recover.mode=auto) or refused at start-up (Hugging Face "
        "Trainer's name).",
    )
