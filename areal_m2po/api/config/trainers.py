"""The root configs of the reward-model (``train_rm``), SFT (``train_sft``) and DPO
(``train_dpo``) trainers."""

from __future__ import annotations

from dataclasses import dataclass

from areal_m2po.api.config.checks import (
    check_bool,
    check_nonempty_str,
    check_number,
    config_field,
    expand_home,
    section_field,
    validate_choices,
    validate_section,
    validate_sections,
)
from areal_m2po.api.config.data import PreferenceDatasetConfig, SFTDatasetConfig
from areal_m2po.api.config.engine import (
    LoRAConfig,
    MicroBatchSpec,
    OptimizerConfig,
    TrainedModelConfig,
    TrainEngineConfig,
)
from areal_m2po.api.config.output import (
    EvaluatorConfig,
    RecoverConfig,
    SaverConfig,
    StatsLoggerConfig,
)
from areal_m2po.api.config.run import (
    BaseExperimentConfig,
    experiment_name_field,
    total_train_steps_field,
)
from areal_m2po.api.errors import ConfigError

# reward-model training (python -m areal_m2po.train_rm)


@dataclass
class RWModelConfig(TrainedModelConfig):
    """The reward model being trained: ``AutoModelForSequenceClassification`` with one label
    built from a causal LM (a fresh scalar head on its body), scoring the last real token."""

    path: str = config_field(
        "builtin:smollm2-135m-instruct",
        "Causal LM (or sequence-classification model) to start from: a local directory, hub "
        "id, 'builtin:smollm2-135m-instruct' or 'builtin:tiny'.",
    )
    optimizer: OptimizerConfig = section_field(OptimizerConfig, "Optimizer settings.")
    mb_spec: MicroBatchSpec = section_field(
        lambda: MicroBatchSpec(max_tokens_per_mb=None, packing=False),
        "How each rank's share of the pairs is split into micro-batches (gradient "
        "accumulation); a pair's chosen and rejected texts stay together and count together "
        "against max_tokens_per_mb; packing does not apply (the reward model's forward is "
        "padded). Default: the whole share in one forward.",
    )
    lora: LoRAConfig | None = config_field(
        None,
        "Train LoRA adapters and the score head instead of every weight (null: full "
        "fine-tuning). Saves write the adapter; set lora.save_merged for the merged model "
        "PPO's reward.model.path loads.",
    )
    disable_dropout: bool = config_field(
        False,
        "AReaL key: set every dropout probability of the model to 0 while it trains (false: the "
        "model's own dropout applies).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_section(self, "lora", LoRAConfig, optional=True)
        check_bool("disable_dropout", self.disable_dropout)
        validate_section(self, "optimizer", OptimizerConfig)
        validate_section(self, "mb_spec", MicroBatchSpec)


@dataclass
class RWConfig(BaseExperimentConfig):
    """Reward-model training (``python -m areal_m2po.train_rm``): a Bradley-Terry reward model
    learned from preference pairs. Names follow TRL's RewardTrainer (max_length,
    center_rewards_coefficient) and AReaL's RW trainer."""

    experiment_name: str = experiment_name_field("rw")
    max_length: int = config_field(
        1024,
        "Longest prompt + completion in tokens; a longer pair is an error naming its file and "
        "line (never cut).",
    )
    center_rewards_coefficient: float | None = config_field(
        None,
        "Weight of mean((r_chosen + r_rejected)^2) added to the loss to keep rewards centred "
        "(TRL's; null: off).",
    )
    model: RWModelConfig = section_field(RWModelConfig, "The reward model and its optimizer.")
    train_dataset: PreferenceDatasetConfig = section_field(
        PreferenceDatasetConfig, "Training preference pairs."
    )
    valid_dataset: PreferenceDatasetConfig | None = config_field(
        None, "Held-out pairs for eval/accuracy (null: no evaluation)."
    )
    evaluator: EvaluatorConfig = section_field(EvaluatorConfig, "Held-out evaluation.")
    saver: SaverConfig = section_field(SaverConfig, "HF-format reward-model saves.")
    stats_logger: StatsLoggerConfig = section_field(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("max_length", self.max_length, ge=1, integer=True)
        check_number(
            "center_rewards_coefficient", self.center_rewards_coefficient, ge=0, optional=True
        )
        validate_sections(self)

    def check_required(self) -> None:
        """Fields that have no usable default; checked when a run starts (so ``RWConfig()``,
        ``--help`` and ``--print-config`` work without them)."""
        _check_preference_data(self)


# supervised fine-tuning (python -m areal_m2po.train_sft)


def _sft_model_default() -> TrainEngineConfig:
    return TrainEngineConfig(optimizer=OptimizerConfig(lr=2e-5))


def _sft_valid_default() -> SFTDatasetConfig:
    return SFTDatasetConfig(split="test", batch_size=32, shuffle=False, max_samples=64)


def _sft_evaluator_default() -> EvaluatorConfig:
    return EvaluatorConfig(freq_steps=10)


@dataclass
class SFTConfig(BaseExperimentConfig):
    """Supervised fine-tuning (``python -m areal_m2po.train_sft``): the token-mean negative
    log-likelihood of the completion (assistant) tokens, through the PPO trainer's engine. Its
    defaults are the built-in demo: SmolLM2-135M-Instruct on the correct answers of the built-in
    arithmetic task, about a minute on a CPU."""

    experiment_name: str = experiment_name_field("sft")
    total_train_steps: int | None = total_train_steps_field(30)
    max_length: int = config_field(
        1024,
        "Longest example in tokens; a longer one is an error naming its file and line (never cut).",
    )
    model: TrainEngineConfig = section_field(
        _sft_model_default, "The model, its optimizer, micro-batches, backend and LoRA."
    )
    train_dataset: SFTDatasetConfig = section_field(SFTDatasetConfig, "Training examples.")
    valid_dataset: SFTDatasetConfig | None = section_field(
        _sft_valid_default,
        "Held-out examples for eval/loss and eval/perplexity (null: no evaluation).",
    )
    evaluator: EvaluatorConfig = section_field(_sft_evaluator_default, "Held-out evaluation.")
    saver: SaverConfig = section_field(SaverConfig, "HF-format model saves.")
    recover: RecoverConfig = section_field(RecoverConfig, "Resumable full-state checkpoints.")
    stats_logger: StatsLoggerConfig = section_field(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number("max_length", self.max_length, ge=2, integer=True)
        validate_sections(self)


# direct preference optimization (python -m areal_m2po.train_dpo)
DPO_LOSS_TYPES = ("sigmoid", "ipo")


def _dpo_model_default() -> TrainEngineConfig:
    return TrainEngineConfig(optimizer=OptimizerConfig(lr=1e-6))


def _dpo_evaluator_default() -> EvaluatorConfig:
    return EvaluatorConfig(freq_steps=10)


@dataclass
class DPOConfig(BaseExperimentConfig):
    """Direct preference optimization (``python -m areal_m2po.train_dpo``): the policy learns
    from preference pairs directly, against a frozen reference, through the SFT trainer's engine
    (DDP, FSDP2, LoRA, micro-batches). Names follow TRL's DPOTrainer and AReaL's DPO trainer
    (beta, label_smoothing, loss_type, max_length)."""

    experiment_name: str = experiment_name_field("dpo")
    max_length: int = config_field(
        1024,
        "Longest prompt + completion in tokens; a longer pair is an error naming its file and "
        "line (never cut).",
    )
    beta: float = config_field(
        0.1,
        "Weight of the KL term: the implicit reward is beta * log(pi / pi_ref). Higher keeps "
        "the policy nearer the reference; for ipo, the target margin is 1 / (2 beta).",
    )
    label_smoothing: float = config_field(
        0.0,
        "Conservative DPO (loss_type sigmoid): the assumed probability that a pair's label is "
        "flipped, in [0, 0.5); 0: plain DPO.",
    )
    loss_type: str = config_field(
        "sigmoid",
        "sigmoid: DPO's -log sigmoid(beta * h), h the chosen minus the rejected log-ratio; ipo: "
        "(h - 1 / (2 beta))^2 on per-token (length-normalised) log-ratios.",
        choices=DPO_LOSS_TYPES,
    )
    ref_path: str | None = config_field(
        None,
        "Frozen reference policy. null: the start model (model.path; with model.lora, the "
        "model itself with the adapter disabled, no second copy); a path loads that model "
        "(model.dtype, same tokenizer).",
    )
    model: TrainEngineConfig = section_field(
        _dpo_model_default, "The policy, its optimizer, micro-batches, backend and LoRA."
    )
    train_dataset: PreferenceDatasetConfig = section_field(
        PreferenceDatasetConfig,
        "Training pairs: prompt, chosen and rejected as strings or lists of {role, content} turns.",
    )
    valid_dataset: PreferenceDatasetConfig | None = config_field(
        None,
        "Held-out pairs for eval/accuracy, eval/margin and the implicit rewards (null: no "
        "evaluation).",
    )
    evaluator: EvaluatorConfig = section_field(_dpo_evaluator_default, "Held-out evaluation.")
    saver: SaverConfig = section_field(SaverConfig, "HF-format model saves.")
    recover: RecoverConfig = section_field(RecoverConfig, "Resumable full-state checkpoints.")
    stats_logger: StatsLoggerConfig = section_field(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        expand_home(self, "ref_path")
        super().__post_init__()
        check_number("max_length", self.max_length, ge=2, integer=True)
        validate_choices(self)
        check_number("beta", self.beta, gt=0)
        check_number("label_smoothing", self.label_smoothing, ge=0, lt=0.5)
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ConfigError(
                "label_smoothing",
                f"must be 0 with loss_type=ipo (got {self.label_smoothing!r}); label smoothing "
                "is a sigmoid-loss option",
            )
        check_nonempty_str(
            "ref_path", self.ref_path, optional=True, null_means="means the start model"
        )
        validate_sections(self)

    def check_required(self) -> None:
        """Fields that have no usable default; checked when a run starts (so ``DPOConfig()``,
        ``--help`` and ``--print-config`` work without them)."""
        _check_preference_data(self)


def _check_preference_data(config: RWConfig | DPOConfig) -> None:
    """The preference data a reward-model or DPO run needs: a training file, and a held-out
    file when ``valid_dataset`` is on (ConfigError naming the key)."""
    if config.train_dataset.path is None:
        raise ConfigError(
            "train_dataset.path", "must be set: a preference .jsonl/.json/.parquet file"
        )
    if config.valid_dataset is not None and config.valid_dataset.path is None:
        raise ConfigError("valid_dataset.path", "must be set when valid_dataset is on")
