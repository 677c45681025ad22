"""What a run writes and when: model saves, recover checkpoints, evaluation and metric
logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_m2po.api.config.checks import (
    check_bool,
    check_number,
    config_field,
    expand_home,
    section_field,
    validate_choices,
)


def _freq_epochs_field(what: str) -> Any:
    return config_field(
        None,
        f"AReaL key: {what} after the last step of every N-th epoch (null: not by epochs).",
    )


def _freq_secs_field(what: str) -> Any:
    return config_field(
        None,
        f"AReaL key: {what} after the first step that ends N or more seconds after the last "
        "time (or the start of training); all processes decide together (null: not by time).",
    )


def _check_cadence(section: Any) -> None:
    """``freq_steps``/``freq_epochs`` integers >= 1, ``freq_secs`` > 0, each or null."""
    for name in ("freq_steps", "freq_epochs"):
        check_number(name, getattr(section, name), ge=1, integer=True, optional=True)
    check_number("freq_secs", section.freq_secs, gt=0, optional=True)


@dataclass
class SaverConfig:
    """Hugging Face-format saves of the policy (save_pretrained + tokenizer). A save is due
    when any of ``freq_steps``, ``freq_epochs`` and ``freq_secs`` says so."""

    freq_steps: int | None = config_field(None, "Save every N steps (null: only at the end).")
    freq_epochs: int | None = _freq_epochs_field("save")
    freq_secs: float | None = _freq_secs_field("save")
    save_at_end: bool = config_field(True, "Save when training finishes.")

    def __post_init__(self) -> None:
        _check_cadence(self)
        check_bool("save_at_end", self.save_at_end)


@dataclass
class RecoverConfig:
    """Full-state checkpoints for resuming a run that died. A checkpoint is due (after a good
    step, unless ``mode`` is disabled) when any of ``freq_steps``, ``freq_epochs`` and
    ``freq_secs`` says so."""

    mode: str = config_field(
        "disabled",
        "disabled: never resume (an output_dir that already holds a run is refused at start-up "
        "unless overwrite_output_dir); auto: resume if a checkpoint exists in output_dir; "
        "resume: resume and fail if there is none (AReaL key: its on / off are auto / "
        "disabled).",
        choices=("disabled", "auto", "resume"),
    )
    freq_steps: int | None = config_field(
        10, "Write a recover checkpoint every N steps (null: not by steps)."
    )
    freq_epochs: int | None = _freq_epochs_field("write a recover checkpoint")
    freq_secs: float | None = _freq_secs_field("write a recover checkpoint")
    keep_last: int = config_field(2, "Recover checkpoints kept.")
    allow_changed_keys: bool = config_field(
        False,
        "Resume even though training keys (the loss and its coefficients, the optimizer's "
        "lr, betas, eps and weight decay, thresholds, lengths, the reward) differ from the "
        "recover checkpoint's, and train with the new values; config.yaml then names each "
        "change. The model (actor.path, critic.path, model.path, lora), optimizer.type, seed "
        "and train_dataset.* cannot change on a resume: refused even then. false: such a "
        "resume is refused, naming the keys.",
    )

    def __post_init__(self) -> None:
        validate_choices(self)
        _check_cadence(self)
        check_number("keep_last", self.keep_last, ge=1, integer=True)
        check_bool("allow_changed_keys", self.allow_changed_keys)


@dataclass
class EvaluatorConfig:
    """Periodic greedy evaluation on the held-out split (valid_dataset), due when any of
    ``freq_steps``, ``freq_epochs`` and ``freq_secs`` says so."""

    freq_steps: int | None = config_field(
        5, "Evaluate every N steps (null: never during training)."
    )
    freq_epochs: int | None = _freq_epochs_field("evaluate")
    freq_secs: float | None = _freq_secs_field("evaluate")
    eval_at_start: bool = config_field(
        True, "Evaluate before the first step (AReaL key: evaluator.eval_before_train)."
    )
    eval_at_end: bool = config_field(True, "Evaluate after the last step.")

    def __post_init__(self) -> None:
        _check_cadence(self)
        check_bool("eval_at_start", self.eval_at_start)
        check_bool("eval_at_end", self.eval_at_end)


@dataclass
class WandBConfig:
    """Weights & Biases logging."""

    mode: str = config_field(
        "disabled",
        "wandb mode (offline works without network).",
        choices=("disabled", "offline", "online"),
    )
    project: str = config_field("areal_m2po", "wandb project.")
    entity: str | None = config_field(None, "wandb entity.")
    name: str | None = config_field(None, "Run name (null: experiment_name/trial_name).")
    group: str | None = config_field(None, "Run group.")
    tags: list[str] | None = config_field(None, "Run tags.")

    def __post_init__(self) -> None:
        validate_choices(self)


@dataclass
class TensorBoardConfig:
    """TensorBoard logging."""

    path: str | None = config_field(None, "Event directory (null: off).")

    def __post_init__(self) -> None:
        expand_home(self, "path")


@dataclass
class StatsLoggerConfig:
    """Where per-step metrics go."""

    jsonl: bool = config_field(True, "Write output_dir/metrics.jsonl, one JSON object per step.")
    console: bool = config_field(True, "Print a compact line per step.")
    progress_bar: bool = config_field(
        True,
        "Show a step bar (steps, time left, the reward or loss and the last held-out figure) "
        "on the main process when stderr is a terminal; log files and pipes get the per-step "
        "metrics line only.",
    )
    wandb: WandBConfig = section_field(WandBConfig, "wandb settings.")
    tensorboard: TensorBoardConfig = section_field(TensorBoardConfig, "TensorBoard settings.")

    def __post_init__(self) -> None:
        for name in ("jsonl", "console", "progress_bar"):
            check_bool(name, getattr(self, name))
