"""The run fields every trainer's root config shares (names, seed, output folder, length of the
run, threads, tokenizer), declared and checked once in :class:`BaseExperimentConfig` (AReaL's
name), the base of ``PPOConfig``, ``RWConfig``, ``SFTConfig`` and ``DPOConfig``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_m2po.api.config.checks import (
    check_bool,
    check_nonempty_str,
    check_number,
    check_str,
    config_field,
    expand_home,
)

HOST_MMAP_THRESHOLD_MIB = 1
"""Default ``host_mmap_threshold_mib`` of the root configs."""


def experiment_name_field(default: str) -> Any:
    """The ``experiment_name`` key with a trainer's own default (``m2po-arith``, ``rw``, ...)."""
    return config_field(default, "Experiment name: the first part of the default output_dir.")


def total_train_steps_field(default: int | None) -> Any:
    """The ``total_train_steps`` key with a trainer's own default."""
    return config_field(
        default, "Stop after this many optimizer steps (null: run all total_train_epochs)."
    )


@dataclass
class BaseExperimentConfig:
    """The keys every trainer's root config starts with, in this order; a trainer's config
    adds its sections after them (and may restate the default of ``experiment_name`` or
    ``total_train_steps``, never their meaning)."""

    experiment_name: str = experiment_name_field("run")
    trial_name: str = config_field(
        "trial0", "Trial name: the second part of the default output_dir."
    )
    seed: int = config_field(
        1, "Global seed (data order, sampling, initialisation of new weights such as a head)."
    )
    output_dir: str | None = config_field(
        None,
        "Run directory: config.yaml, metrics.jsonl, checkpoints/ (saved models; "
        "checkpoints/final at the end), recover/ (null: outputs/<experiment_name>/<trial_name>). "
        "A leading ~ is the home directory.",
    )
    overwrite_output_dir: bool = config_field(
        False,
        "Replace the run already in output_dir and start afresh: metrics.jsonl starts empty, "
        "its recover checkpoints are deleted at this run's first one, saved models are "
        "replaced tag by tag. Without it a folder holding a run (metrics.jsonl, checkpoints/, "
        "recover/) is resumed (recover.mode=auto) or refused at start-up (Hugging Face "
        "Trainer's name).",
    )
    total_train_epochs: int = config_field(1, "Epochs over the training data.")
    total_train_steps: int | None = total_train_steps_field(None)
    num_threads: int | None = config_field(
        None, "torch CPU threads (null: torch's default). Fix it when timing."
    )
    host_mmap_threshold_mib: int | None = config_field(
        HOST_MMAP_THRESHOLD_MIB,
        "CPU runs on glibc (Linux): host blocks of at least this many MiB get their own mmap and "
        "go back to the OS when freed (mallopt M_MMAP_THRESHOLD, 1-32), so the activations one "
        "micro-batch frees do not stay resident beside the next; null: glibc's default (a "
        "threshold it raises itself up to 32 MiB). Not applied when CUDA is used "
        "(docs/performance.md, memory).",
    )
    tokenizer_path: str | None = config_field(
        None, "Tokenizer (null: the trained model's path, actor.path or model.path)."
    )

    def __post_init__(self) -> None:
        """Check the run fields and derive ``output_dir`` from the names when it is null."""
        expand_home(self, "output_dir", "tokenizer_path")
        for name in ("experiment_name", "trial_name"):
            check_nonempty_str(name, getattr(self, name))
        check_number("seed", self.seed, ge=0, integer=True)
        check_nonempty_str(
            "output_dir", self.output_dir, optional=True, null_means="derives it from the names"
        )
        if self.output_dir is None:
            self.output_dir = f"outputs/{self.experiment_name}/{self.trial_name}"
        check_bool("overwrite_output_dir", self.overwrite_output_dir)
        check_number("total_train_epochs", self.total_train_epochs, ge=1, integer=True)
        check_number("total_train_steps", self.total_train_steps, ge=1, integer=True, optional=True)
        check_number("num_threads", self.num_threads, ge=1, integer=True, optional=True)
        check_number(
            "host_mmap_threshold_mib",
            self.host_mmap_threshold_mib,
            ge=1,
            le=32,
            integer=True,
            optional=True,
        )
        check_str("tokenizer_path", self.tokenizer_path, optional=True)
