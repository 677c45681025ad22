"""The other models of a PPO run: the critic (trained), the reference and the distillation
teacher (frozen)."""

from __future__ import annotations

from dataclasses import dataclass

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
from areal_m2po.api.config.engine import (
    FrozenMicroBatchSpec,
    MicroBatchSplit,
    TrainEngineConfig,
)
from areal_m2po.api.errors import ConfigError


@dataclass
class CriticConfig(TrainEngineConfig):
    """Optional value model for classic PPO with GAE (off by default: GRPO needs none)."""

    enabled: bool = config_field(False, "Train a critic and use GAE advantages.")
    value_eps_clip: float = config_field(0.2, "Clip range of the value loss around the old values.")
    ppo_n_minibatches: int = config_field(1, "Critic minibatches per training batch.")
    # narrower than the policy's section (no packing keys); the engine reads the same
    # attributes of both
    mb_spec: MicroBatchSplit = section_field(  # type: ignore[assignment]
        MicroBatchSplit,
        "Micro-batch split of the critic (its value forward is always padded and scores every "
        "prompt in full: packing and shared prompts are actor.mb_spec keys).",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool("enabled", self.enabled)
        check_number("value_eps_clip", self.value_eps_clip, gt=0)
        check_number("ppo_n_minibatches", self.ppo_n_minibatches, ge=1, integer=True)


@dataclass
class RefConfig:
    """Frozen reference policy for the KL penalty (loaded only when actor.kl_ctl > 0). It runs
    in eval mode (no dropout) with the actor's backend; AReaL's ref section maps here."""

    path: str | None = config_field(None, "Reference model path (null: actor.path).")
    dtype: str = config_field("float32", "Reference parameter dtype.", choices=DTYPES)
    attn_implementation: str | None = config_field(
        None,
        "Attention kernel of the reference (AReaL key: ref.attn_impl; null: "
        "actor.attn_implementation).",
        choices=(None, *ATTN_IMPLEMENTATIONS),
    )
    mb_spec: FrozenMicroBatchSpec | None = config_field(
        None,
        "Micro-batch split of the reference's log-prob forward (AReaL key: ref.mb_spec; null: "
        "actor.mb_spec). The reference never trains, so it has no shared_prefix_train.",
    )

    def __post_init__(self) -> None:
        expand_home(self, "path")
        validate_choices(self)
        check_nonempty_str("path", self.path, optional=True, null_means="means actor.path")
        validate_section(self, "mb_spec", MicroBatchSplit, optional=True)

    def engine_config(self, actor: TrainEngineConfig) -> TrainEngineConfig:
        """The frozen engine's config: this section's model, kernel and micro-batch split
        (the actor's where null), sharded like the actor."""
        return TrainEngineConfig(
            path=self.path or actor.path,
            dtype=self.dtype,
            attn_implementation=self.attn_implementation or actor.attn_implementation,
            backend=actor.backend,
            fsdp=actor.fsdp,
            mb_spec=self.mb_spec or actor.mb_spec,  # type: ignore[arg-type] # a frozen split
        )


@dataclass
class TeacherConfig:
    """On-policy distillation (docs/distillation.md): a frozen teacher scores the tokens the
    student sampled, and each policy token's advantage becomes ``rl_loss_weight * A_task +
    distill_loss_weight * A_distill``, ``A_distill`` the log-ratio log pi_teacher - log
    pi_student (centred, optionally discounted). AReaL's key names; slime's ``--opd-kl-coef``
    is ``distill_loss_weight``. Placed like the reference model (the actor's backend and
    micro-batches); no LoRA, no optimizer."""

    path: str | None = config_field(
        None,
        "The teacher: a local directory or hub id loadable by AutoModelForCausalLM, or a "
        "built-in (see actor.path). It must share the student's tokenizer. Required when this "
        "section is on.",
    )
    dtype: str = config_field("float32", "Teacher parameter dtype.", choices=DTYPES)
    attn_implementation: str = config_field(
        "sdpa", "Attention kernel of the teacher.", choices=ATTN_IMPLEMENTATIONS
    )
    rl_loss_weight: float = config_field(
        1.0,
        "Weight of the task-reward advantage (the actor's estimator and adv_norm, as without a "
        "teacher); 0 is pure distillation (the reward is still computed and logged).",
    )
    distill_loss_weight: float = config_field(
        1.0,
        "Weight of the per-token reverse-KL advantage log pi_teacher(y_t) - log pi_student(y_t) "
        "(the student's proximal log-probs, both at the rollout temperature), added to the "
        "task advantage after its normalisation.",
    )
    center_reverse_kl: bool = config_field(
        True,
        "Subtract the mean log-ratio of the batch's policy tokens (all ranks) from each before "
        "discounting and weighting: a baseline that leaves the expected gradient unchanged and "
        "lowers its variance, as Tinker's on-policy distillation does (false: slime's and "
        "AReaL's raw log-ratio).",
    )
    kl_discount: float = config_field(
        0.0,
        "0: each policy token's reverse-KL advantage is its own log-ratio (slime, AReaL); > 0: "
        "the discounted sum of the log-ratios of it and the policy tokens after it (Tinker's "
        "kl_discount_factor; 1 is the sequence's remaining reverse KL).",
    )

    def __post_init__(self) -> None:
        expand_home(self, "path")
        validate_choices(self)
        check_nonempty_str("path", self.path, optional=True)
        check_number("rl_loss_weight", self.rl_loss_weight, ge=0)
        check_number("distill_loss_weight", self.distill_loss_weight, ge=0)
        if self.rl_loss_weight == 0 and self.distill_loss_weight == 0:
            raise ConfigError(
                "distill_loss_weight", "rl_loss_weight and distill_loss_weight are both 0"
            )
        check_bool("center_reverse_kl", self.center_reverse_kl)
        check_number("kl_discount", self.kl_discount, ge=0, le=1)
