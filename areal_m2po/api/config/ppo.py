"""The root config of a PPO/GRPO run (``python -m areal_m2po.train``) and the checks of the
settings that span its sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_m2po.api.config.actor import OUTCOME_ESTIMATORS, ActorConfig, NormConfig
from areal_m2po.api.config.checks import config_field, section_field, validate_sections
from areal_m2po.api.config.data import DatasetConfig, RewardConfig, valid_dataset_default
from areal_m2po.api.config.models import CriticConfig, RefConfig, TeacherConfig
from areal_m2po.api.config.output import (
    EvaluatorConfig,
    RecoverConfig,
    SaverConfig,
    StatsLoggerConfig,
)
from areal_m2po.api.config.rollout import GenerationConfig, RolloutConfig
from areal_m2po.api.config.run import (
    BaseExperimentConfig,
    experiment_name_field,
    total_train_steps_field,
)
from areal_m2po.api.errors import ConfigError


def _default_actor() -> ActorConfig:
    # AReaL's M2PO recipe: decoupled PPO (clip against the proximal policy, weight by
    # pi_prox / pi_behave) with the M2PO mask on behaviour vs proximal
    return ActorConfig(m2_threshold=0.04, use_decoupled_loss=True)


def _default_rollout() -> RolloutConfig:
    # one step of lag, as in a one-step-ahead asynchronous pipeline, so M2PO has work to do
    return RolloutConfig(staleness=1)


@dataclass
class PPOConfig(BaseExperimentConfig):
    """A whole PPO/GRPO run. Its defaults are the built-in demo: SmolLM2-135M-Instruct learning
    2-digit addition with M2PO on a 2-core CPU in about ten minutes."""

    experiment_name: str = experiment_name_field("m2po-arith")
    total_train_steps: int | None = total_train_steps_field(25)
    actor: ActorConfig = section_field(_default_actor, "The policy and its PPO/M2PO loss.")
    ref: RefConfig = section_field(RefConfig, "Reference model for the KL penalty.")
    teacher: TeacherConfig | None = config_field(
        None, "On-policy distillation from a frozen teacher (null: off; teacher.path turns it on)."
    )
    critic: CriticConfig = section_field(CriticConfig, "Optional critic (classic PPO).")
    gconfig: GenerationConfig = section_field(GenerationConfig, "Generation (sampling) settings.")
    rollout: RolloutConfig = section_field(_default_rollout, "Rollout staleness and filtering.")
    train_dataset: DatasetConfig = section_field(DatasetConfig, "Training prompts.")
    valid_dataset: DatasetConfig = section_field(
        valid_dataset_default, "Held-out evaluation prompts."
    )
    reward: RewardConfig = section_field(RewardConfig, "Reward function.")
    saver: SaverConfig = section_field(SaverConfig, "HF-format policy saves.")
    recover: RecoverConfig = section_field(RecoverConfig, "Resumable full-state checkpoints.")
    evaluator: EvaluatorConfig = section_field(EvaluatorConfig, "Held-out evaluation.")
    stats_logger: StatsLoggerConfig = section_field(StatsLoggerConfig, "Metric logging.")

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_sections(self)
        self._check_combinations()
        self._check_behaviour_logprobs()

    @property
    def episode_budget(self) -> int:
        """``rollout.max_episode_tokens`` resolved (tokens): as set, else the longest prompt
        either dataset keeps plus one turn of ``gconfig.max_new_tokens``, at most
        ``gconfig.max_tokens`` (no engine call may hold more)."""
        if self.rollout.max_episode_tokens is not None:
            return int(self.rollout.max_episode_tokens)
        derived = self._longest_prompt()[1] + self.gconfig.max_new_tokens
        cap = self.gconfig.max_tokens
        return derived if cap is None else min(derived, int(cap))

    def _longest_prompt(self) -> tuple[str, int]:
        """The dataset key that keeps the longest prompts, and that length."""
        train, valid = self.train_dataset.max_prompt_length, self.valid_dataset.max_prompt_length
        if valid > train:
            return "valid_dataset.max_prompt_length", valid
        return "train_dataset.max_prompt_length", train

    def _budget_origin(self) -> str:
        """The keys the episode budget comes from, for a message."""
        if self.rollout.max_episode_tokens is not None:
            return "rollout.max_episode_tokens"
        key, prompt = self._longest_prompt()
        cap = self.gconfig.max_tokens
        if cap is not None and cap < prompt + self.gconfig.max_new_tokens:
            return "gconfig.max_tokens"
        return f"{key} + gconfig.max_new_tokens"

    def check_model_positions(self, positions: Any, source: str) -> None:
        """The one rule for the policy's positions: ConfigError when the episode budget exceeds
        ``positions``, the policy's ``max_position_embeddings`` (ignored unless an integer),
        read from ``source`` (its ``config.json`` at start-up, or the loaded model's config).
        A value check: the caller reads the number."""
        budget = self.episode_budget
        if not isinstance(positions, int) or isinstance(positions, bool) or budget <= positions:
            return
        origin = self._budget_origin()
        model = f"the model's max_position_embeddings ({positions}, {source})"
        key, prompt = self._longest_prompt()
        new = self.gconfig.max_new_tokens
        if origin == "gconfig.max_tokens" or (
            origin == "rollout.max_episode_tokens" and prompt + new <= positions
        ):  # lowering the key that set the budget is enough
            raise ConfigError(
                origin, f"the episode budget {budget} exceeds {model}; set at most {positions}"
            )
        # a prompt and a turn do not fit: only shorter ones do
        need = f"a prompt of {key} ({prompt}) and a turn of gconfig.max_new_tokens ({new})"
        need = f"{need} need {prompt + new} positions, more than {model}"
        if positions - prompt >= 1:
            fix = f"set gconfig.max_new_tokens to at most {positions - prompt} (or lower {key})"
            raise ConfigError("gconfig.max_new_tokens", f"{need}; {fix}")
        half = positions // 2
        fix = (
            f"set it at most {positions - new}"
            if positions - new >= 1
            else (f"set it at most {positions - half} and gconfig.max_new_tokens at most {half}")
        )
        raise ConfigError(key, f"{need}; {fix}")

    def _check_episode_budget(self) -> None:
        """The episode budget holds a prompt and a turn, and fits vLLM's context (the model's
        positions are checked at start-up, :meth:`check_model_positions`)."""
        budget, explicit = self.episode_budget, self.rollout.max_episode_tokens is not None
        key, prompt = self._longest_prompt()
        new = self.gconfig.max_new_tokens
        if explicit and budget < prompt + new:
            raise ConfigError(
                "rollout.max_episode_tokens",
                f"{budget} cannot hold a prompt of {key} ({prompt}) and a turn of "
                f"gconfig.max_new_tokens ({new}): set at least {prompt + new}, or null",
            )
        origin = self._budget_origin()
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
        if est in OUTCOME_ESTIMATORS and self.critic.enabled:
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
