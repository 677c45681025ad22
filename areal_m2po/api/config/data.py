"""Datasets (prompts, preference pairs, supervised examples) and the reward of a PPO run."""

from __future__ import annotations

from dataclasses import dataclass

from areal_m2po.api.config.checks import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    check_bool,
    check_nonempty_str,
    check_number,
    check_str,
    config_field,
    expand_home,
    validate_choices,
    validate_section,
)
from areal_m2po.api.errors import ConfigError


@dataclass
class DatasetConfig:
    """A prompt dataset."""

    path: str = config_field(
        "builtin:arithmetic",
        "'builtin:arithmetic' (seeded 2-digit addition task), a local .jsonl/.json/.parquet file, "
        "or a `datasets` name/directory.",
    )
    split: str = config_field("train", "Split to load.")
    batch_size: int = config_field(8, "Prompts per training step (global, across ranks).")
    shuffle: bool = config_field(True, "Shuffle every epoch (seeded).")
    max_prompt_length: int = config_field(
        256, "Prompts longer than this many tokens are dropped (AReaL key: max_length)."
    )
    max_samples: int | None = config_field(None, "Use at most this many records (null: all).")
    prompt_field: str = config_field("question", "Record field holding the question.")
    answer_field: str = config_field("answer", "Record field holding the reference answer.")
    use_chat_template: bool = config_field(
        True, "Wrap the question in the tokenizer's chat template."
    )
    drop_last: bool = config_field(True, "Drop the last incomplete batch of an epoch.")

    def __post_init__(self) -> None:
        expand_home(self, "path")
        validate_choices(self)
        check_str("path", self.path)
        check_str("split", self.split)
        check_number("batch_size", self.batch_size, ge=1, integer=True)
        check_bool("shuffle", self.shuffle)
        check_number("max_prompt_length", self.max_prompt_length, ge=1, integer=True)
        check_number("max_samples", self.max_samples, ge=1, integer=True, optional=True)
        check_str("prompt_field", self.prompt_field)
        check_str("answer_field", self.answer_field)
        check_bool("use_chat_template", self.use_chat_template)
        check_bool("drop_last", self.drop_last)


def valid_dataset_default() -> DatasetConfig:
    return DatasetConfig(split="test", batch_size=128, shuffle=False, max_samples=128)


@dataclass
class RewardModelConfig:
    """A learned (Bradley-Terry) reward model scoring prompt + completion, as saved by
    ``python -m areal_m2po.train_rm``. Each rank scores its own samples in batches; the reward
    is ``weight * normalised score + verifiable_weight * verifiable reward``."""

    path: str | None = config_field(
        None,
        "The reward model: a directory saved by train_rm (AutoModelForSequenceClassification "
        "with one label, tokenizer alongside). Required when this section is on.",
    )
    tokenizer_path: str | None = config_field(None, "Tokenizer of the reward model (null: path).")
    dtype: str = config_field("float32", "Reward model parameter dtype.", choices=DTYPES)
    attn_implementation: str = config_field(
        "sdpa", "Attention kernel.", choices=ATTN_IMPLEMENTATIONS
    )
    device: str | None = config_field(
        None, "Device of the reward model, e.g. 'cuda:1' (null: the trainer's device)."
    )
    batch_size: int = config_field(32, "Sequences per reward-model forward pass.")
    use_chat_template: bool = config_field(
        True,
        "Render prompt and completion as a user and an assistant turn with the reward model's "
        "chat template, as train_rm does (must match how the model was trained).",
    )
    norm: str | None = config_field(
        None,
        "Normalise the scores before weighting: 'batch' (mean/std of this step's scores over "
        "all ranks), 'running' (mean/std of every score seen so far, this step's included; "
        "saved in recover checkpoints), or null (raw scores).",
        choices=("batch", "running", None),
    )
    norm_eps: float = config_field(1e-5, "Added to the std before dividing.")
    weight: float = config_field(1.0, "Weight of the (normalised) reward-model score.")
    verifiable_weight: float = config_field(
        0.0,
        "Weight of the verifiable reward (reward.path) added to it; 0 trains on the learned "
        "reward alone (the verifiable one is still computed and logged as reward/verifiable).",
    )

    def __post_init__(self) -> None:
        expand_home(self, "path", "tokenizer_path")
        validate_choices(self)
        check_str("path", self.path, optional=True)
        check_str("tokenizer_path", self.tokenizer_path, optional=True)
        check_str("device", self.device, optional=True)
        check_number("batch_size", self.batch_size, ge=1, integer=True)
        check_bool("use_chat_template", self.use_chat_template)
        check_number("norm_eps", self.norm_eps, ge=0)
        check_number("weight", self.weight)
        check_number("verifiable_weight", self.verifiable_weight)
        if self.weight == 0 and self.verifiable_weight == 0:
            raise ConfigError("weight", "weight and verifiable_weight are both 0: no reward")


@dataclass
class RewardConfig:
    """The reward function."""

    path: str = config_field(
        "areal_m2po.reward.math_reward:math_reward_fn",
        "Dotted path 'module:function' of fn(prompt, completion, answer, **fields) -> float.",
    )
    timeout_s: float = config_field(10.0, "A call running longer gets reward 0 (counted).")
    max_workers: int = config_field(4, "Threads scoring samples in parallel.")
    model: RewardModelConfig | None = config_field(
        None,
        "A learned reward model as the reward source (null: the verifiable reward alone).",
    )

    def __post_init__(self) -> None:
        check_str("path", self.path)
        if ":" not in self.path and "." not in self.path:
            raise ConfigError("path", f"must be 'module:function', got {self.path!r}")
        check_number("timeout_s", self.timeout_s, gt=0)
        check_number("max_workers", self.max_workers, ge=1, integer=True)
        validate_section(self, "model", RewardModelConfig, optional=True)
        if self.model is not None and not self.model.path:
            raise ConfigError("model.path", "must be set when reward.model is on")


@dataclass
class PreferenceDatasetConfig:
    """Preference pairs: records with string fields ``prompt``, ``chosen``, ``rejected`` (and an
    optional number ``margin``, TRL's column)."""

    path: str | None = config_field(
        None,
        "A local .jsonl/.json/.parquet file or a `datasets` directory (required for "
        "train_dataset).",
    )
    split: str = config_field("train", "Split to load (`datasets` directories).")
    batch_size: int = config_field(16, "Pairs per optimizer step (global, across ranks).")
    shuffle: bool = config_field(True, "Shuffle every epoch (seeded).")
    max_samples: int | None = config_field(
        None, "Use at most the first this many pairs (null: all)."
    )
    use_chat_template: bool = config_field(
        True,
        "Render prompt and completion as a user and an assistant turn with the tokenizer's chat "
        "template (a reward model's: PPO's reward.model.use_chat_template must match).",
    )
    drop_last: bool = config_field(True, "Drop the last incomplete batch of an epoch.")

    def __post_init__(self) -> None:
        expand_home(self, "path")
        check_nonempty_str("path", self.path, optional=True)
        check_str("split", self.split)
        check_number("batch_size", self.batch_size, ge=1, integer=True)
        check_bool("shuffle", self.shuffle)
        check_number("max_samples", self.max_samples, ge=1, integer=True, optional=True)
        check_bool("use_chat_template", self.use_chat_template)
        check_bool("drop_last", self.drop_last)


@dataclass
class SFTDatasetConfig:
    """Supervised examples: records with a ``messages`` list of ``{role, content}`` turns (the
    loss is on the assistant turns), or a prompt and a completion (the loss is on the
    completion); or 'builtin:arithmetic' (the question and its correct answer)."""

    path: str = config_field(
        "builtin:arithmetic",
        "'builtin:arithmetic' (2-digit additions with their correct answers), a local "
        ".jsonl/.json/.parquet file, or a `datasets` directory saved on disk.",
    )
    split: str = config_field("train", "Split to load (`datasets` directories, the built-in task).")
    batch_size: int = config_field(8, "Examples per optimizer step (global, across ranks).")
    shuffle: bool = config_field(True, "Shuffle every epoch (seeded).")
    max_samples: int | None = config_field(
        None, "Use at most the first this many records (null: all)."
    )
    prompt_field: str = config_field("prompt", "Record field holding the prompt.")
    completion_field: str = config_field("completion", "Record field holding the completion.")
    messages_field: str = config_field(
        "messages", "Record field holding a conversation (used when a record has it)."
    )
    use_chat_template: bool = config_field(
        True,
        "Render prompt and completion as a user and an assistant turn with the tokenizer's chat "
        "template (as PPO renders its prompts); without a template (or false) prompt and "
        "completion are concatenated and EOS appended. Conversations need a template.",
    )
    drop_last: bool = config_field(True, "Drop the last incomplete batch of an epoch.")

    def __post_init__(self) -> None:
        expand_home(self, "path")
        check_nonempty_str("path", self.path)
        check_str("split", self.split)
        check_number("batch_size", self.batch_size, ge=1, integer=True)
        check_bool("shuffle", self.shuffle)
        check_number("max_samples", self.max_samples, ge=1, integer=True, optional=True)
        for name in ("prompt_field", "completion_field", "messages_field"):
            check_str(name, getattr(self, name))
        check_bool("use_chat_template", self.use_chat_template)
        check_bool("drop_last", self.drop_last)
