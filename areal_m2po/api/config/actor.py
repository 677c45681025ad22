"""The PPO actor: the policy being trained, its loss, M2PO, rewards and advantages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
from areal_m2po.api.config.checks import (
    check_bool,
    check_number,
    check_str,
    config_field,
    section_field,
    validate_choices,
    validate_section,
)
from areal_m2po.api.config.engine import TrainEngineConfig
from areal_m2po.api.errors import ConfigError

# The choice lists of the loss/advantage maths are the maths' own (areal_m2po.algo.options,
# imported above): the config fields below offer them.
OUTCOME_ESTIMATORS = ("grpo", "rloo", "reinforce_pp")  # one score per sequence, no critic


@dataclass
class NormConfig:
    """Normalisation of rewards or advantages (GRPO group statistics, RLOO leave-one-out)."""

    mean_level: str | None = config_field(
        "group",
        "Subtract the mean over the batch or the prompt's group (null: no centring).",
        choices=NORM_LEVELS,
    )
    std_level: str | None = config_field(
        "group",
        "Divide by the std over the batch or the group of the centred values, taken around "
        "0 (AReaL's; without centring the root mean square) (null: no scaling).",
        choices=NORM_LEVELS,
    )
    mean_leave1out: bool = config_field(
        False, "Leave-one-out mean (RLOO): each sample is compared with the others' mean."
    )
    std_unbiased: bool = config_field(True, "Unbiased (n-1) standard deviation.")
    eps: float = config_field(1e-5, "Added to the std before dividing.")
    group_size: int | None = config_field(
        None, "Samples per group for group-level statistics (null: gconfig.n_samples)."
    )

    def __post_init__(self) -> None:
        validate_choices(self)
        check_bool("mean_leave1out", self.mean_leave1out)
        check_bool("std_unbiased", self.std_unbiased)
        check_number("eps", self.eps, ge=0)
        check_number("group_size", self.group_size, ge=1, integer=True, optional=True)
        self._check_leave1out()

    def _check_leave1out(self) -> None:
        """A leave-one-out mean needs a mean to leave an element out of."""
        if self.mean_leave1out and self.mean_level is None:
            raise ConfigError(
                "mean_leave1out", "a leave-one-out mean needs mean_level 'batch' or 'group'"
            )


@dataclass
class RejectionSamplingConfig:
    """Masked / truncated importance sampling over the behaviour-vs-proximal discrepancy."""

    level: str = config_field(
        "token", "Act per token or per whole sequence.", choices=IMPORTANCE_SAMPLING_LEVELS
    )
    action: str = config_field(
        "mask",
        "Drop out-of-range tokens/sequences, or clamp the weight into range.",
        choices=REJECTION_ACTIONS,
    )
    metric: str = config_field(
        "ratio",
        "The quantity bounded: the importance ratio pi_prox/pi_behave, a KL estimator of it "
        "(kl_k1/k2/k3), or binary_kl (AReaL's KPop: the larger Bernoulli KL between the sampled "
        "token's proximal and behaviour probabilities, both ways).",
        choices=REJECTION_METRICS,
    )
    agg: str = config_field(
        "mean", "How a sequence-level metric aggregates its tokens.", choices=REJECTION_AGGS
    )
    upper: float | None = config_field(
        5.0, "Upper bound (null: none); 5.0 is AReaL's default (typical: 2.0 or 5.0)."
    )
    lower: float | None = config_field(None, "Lower bound (null: none).")

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
    m2_threshold: float | None = config_field(
        None,
        "M2PO: mask the tokens with the largest (behave_logp - prox_logp)^2 until the mean of the "
        "rest is below this value (paper: 0.04). null disables M2PO.",
    )
    m2_scope: str = config_field(
        "global",
        "Where the M2PO statistic is taken: over the whole PPO minibatch across all micro-batches "
        "and ranks (global), or per micro-batch on each rank as AReaL does (microbatch).",
        choices=("global", "microbatch"),
    )
    m2_token_set: str = config_field(
        "all",
        "Which tokens the M2PO rule takes and may mask: every valid token, as AReaL does (all), or "
        "only those in PPO's active trust-region quadrants, A > 0 and pi_prox > pi_behave or A < 0 "
        "and pi_prox < pi_behave, as the paper's final Algorithm 1 (trust_region); the loss "
        "denominator stays all valid tokens either way.",
        choices=M2_TOKEN_SETS,
    )
    m2_warn_masked_fraction: float = config_field(
        0.2,
        "Warn when the M2PO masked fraction stays above this level for several steps "
        "(raise m2_threshold).",
    )
    # --- policy loss ----------------------------------------------------------------------
    eps_clip: float = config_field(
        0.2, "PPO clip range: ratio clipped to [1-eps_clip, 1+eps_clip_higher]."
    )
    eps_clip_higher: float | None = config_field(
        None, "Upper clip range (DAPO clip-higher); null = eps_clip."
    )
    c_clip: float | None = config_field(
        None, "Dual-clip constant (> 1) bounding the loss of negative-advantage tokens; null = off."
    )
    use_sapo_loss: bool = config_field(
        False, "Use the SAPO soft-gated loss instead of the clipped PPO loss."
    )
    loss_fn: str | None = config_field(
        None,
        "Custom actor loss 'package.module:function' (the ActorLossFn contract in "
        "areal_m2po/trainer/ppo/loss_fn.py: it gets the log-probs, entropy and the prepared "
        "micro-batch with behave_logp, prox_logp and the M2PO mask, returns the loss and stats); "
        "null = the library's clipped PPO / SAPO loss.",
    )
    sapo_tau_pos: float = config_field(1.0, "SAPO gate temperature for positive advantages.")
    sapo_tau_neg: float = config_field(1.05, "SAPO gate temperature for negative advantages.")
    use_cispo_loss: bool = config_field(
        False,
        "Use the CISPO loss (MiniMax-M1) instead of the clipped PPO loss: each token's "
        "importance weight is clipped to [1-eps_clip, 1+eps_clip_higher] and held constant "
        "(no gradient) while its log-prob keeps its gradient, so clipped tokens still learn. "
        "Needs eps_clip_higher > 0 (MiniMax-M1 sets no lower bound: eps_clip >= 1); token "
        "level only; exclusive with use_sapo_loss. AReaL key.",
    )
    use_decoupled_loss: bool = config_field(
        False,
        "Decoupled PPO: clip against the proximal policy and weight by pi_prox/pi_behave.",
    )
    recompute_logprob: bool = config_field(
        True,
        "Recompute log-probs with the policy at the start of the step (proximal log-probs). "
        "Without it prox = behave and M2PO cannot mask anything.",
    )
    prox_logp_method: str = config_field(
        "recompute",
        "How proximal log-probs are obtained: a forward pass at step start (recompute), or the "
        "log-linear interpolation between behaviour and current log-probs by policy version "
        "(loglinear).",
        choices=("recompute", "loglinear"),
    )
    rejection_sampling: RejectionSamplingConfig | None = config_field(
        None,
        "Masked/truncated importance sampling of the decoupled loss's behaviour weight (needs "
        "use_decoupled_loss; null = off). AReaL's "
        "removed behave_imp_weight_cap (and _mode) map here.",
    )
    use_behave_imp_weight: bool = config_field(
        True,
        "Decoupled loss without rejection_sampling: weight each token's loss by the uncapped "
        "behaviour weight pi_prox/pi_behave (the decoupled PPO objective, true) or by nothing "
        "(false: AReaL, whose decoupled loss applies no behaviour weight when "
        "rejection_sampling is null). With rejection_sampling set the weight it bounds is "
        "always applied.",
    )
    importance_sampling_level: str = config_field(
        "token",
        "Ratio per token (PPO) or per sequence (GSPO).",
        choices=IMPORTANCE_SAMPLING_LEVELS,
    )
    loss_agg_mode: str = config_field(
        "token-mean",
        "Loss aggregation: mean over all valid tokens; mean over sequences of their token mean; "
        "or the Dr.GRPO constant normaliser (sum / (n_seqs * max_new_tokens)). Sequences count "
        "when they have a valid token, so the gradient is the same for any micro-batch split.",
        choices=LOSS_AGG_MODES,
    )
    ppo_n_minibatches: int = config_field(
        1, "PPO minibatches (optimizer steps) per training batch."
    )
    temperature: float = config_field(
        1.0, "Temperature of the training log-probs; must equal gconfig.temperature."
    )
    skip_zero_adv_seqs: bool = config_field(
        True,
        "Leave sequences whose advantages are all zero out of the forward/backward pass; their "
        "tokens still count in the loss denominator, so the gradient is unchanged. Not applied "
        "with m2_scope=microbatch, whose statistic depends on the rows a micro-batch holds.",
    )
    # --- rewards and advantages -------------------------------------------------------------
    kl_ctl: float = config_field(0.0, "Coefficient of the KL(policy || ref) penalty in the reward.")
    kl_estimator: str = config_field(
        "k1",
        "KL estimator of the reward penalty; each token's estimate is clamped to [-10, 10] "
        "(as AReaL's).",
        choices=KL_ESTIMATORS,
    )
    kl_logp: str = config_field(
        "proximal",
        "Policy log-probs in the KL reward penalty: the proximal ones (the policy at the start "
        "of the step) or the behaviour ones recorded while sampling (AReaL with "
        "use_decoupled_loss; without it AReaL uses the proximal ones).",
        choices=("proximal", "behave"),
    )
    reward_scaling: float = config_field(
        1.0, "Rewards become clip((r + reward_bias) * reward_scaling)."
    )
    reward_bias: float = config_field(0.0, "Added to rewards before scaling.")
    reward_clip: float = config_field(20.0, "Rewards are clipped to [-reward_clip, reward_clip].")
    reward_norm: NormConfig | None = config_field(
        None, "Normalise rewards before advantages (null = off)."
    )
    adv_norm: NormConfig | None = section_field(
        NormConfig, "Normalise advantages (default: GRPO group mean/std); null = off."
    )
    adv_norm_weighting: str = config_field(
        "sequence",
        "How adv_norm weights rows when every token of a row carries the row's score (no "
        "critic, no KL penalty: GRPO/RLOO): each sequence once (sequence; the GRPO paper) or "
        "each valid token once, so a row weighs its length (token; AReaL). Token advantages "
        "(critic or KL penalty) are always token-weighted.",
        choices=("sequence", "token"),
    )
    discount: float = config_field(1.0, "GAE discount gamma.")
    gae_lambda: float = config_field(1.0, "GAE lambda.")
    adv_estimator: str | None = config_field(
        None,
        "Advantage estimator: grpo (each sequence's score, normalised by adv_norm), gae (the KL "
        "penalty and the score on the last token through GAE with the critic's values, zeros "
        "without a critic), rloo (leave-one-out group mean baseline), reinforce_pp (REINFORCE++ "
        "baseline: group mean, then batch whitening), or 'package.module:function' (the "
        "AdvantageEstimator contract in areal_m2po/algo/advantages.py); null = gae with a "
        "critic or a KL reward penalty (kl_ctl > 0), else grpo.",
    )
    mask_no_eos_with_zero: bool = config_field(
        False,
        "Give truncated sequences (no EOS within max_new_tokens) a score of 0 after reward "
        "scaling and reward_norm; they still train (AReaL's meaning). overlong_filtering "
        "leaves them out of the loss instead.",
    )
    overlong_filtering: bool = config_field(
        False,
        "DAPO overlong filtering: truncated sequences (no EOS within max_new_tokens) get no "
        "loss weight (taken out of the loss mask); they still count in the group statistics.",
    )
    overlong_reward_penalty: bool = config_field(
        False, "DAPO soft overlong punishment near max_new_tokens."
    )
    overlong_tokens: int | None = config_field(
        None, "Length of the penalty window at the end of the generation budget."
    )
    overlong_penalty_factor: float | None = config_field(None, "Maximum overlong penalty.")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_loss_fields()
        self._check_reward_fields()
        for name in ("reward_norm", "adv_norm"):
            validate_section(self, name, NormConfig, optional=True)
        validate_section(self, "rejection_sampling", RejectionSamplingConfig, optional=True)
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
        check_number("m2_threshold", self.m2_threshold, gt=0, optional=True)
        check_number("m2_warn_masked_fraction", self.m2_warn_masked_fraction, gt=0, le=1)
        check_number("eps_clip", self.eps_clip, ge=0)
        check_number("eps_clip_higher", self.eps_clip_higher, ge=0, optional=True)
        check_number("c_clip", self.c_clip, gt=1, optional=True)
        check_bool("use_sapo_loss", self.use_sapo_loss)
        check_bool("use_cispo_loss", self.use_cispo_loss)
        check_str("loss_fn", self.loss_fn, optional=True)
        check_number("sapo_tau_pos", self.sapo_tau_pos, gt=0)
        check_number("sapo_tau_neg", self.sapo_tau_neg, gt=0)
        check_bool("use_decoupled_loss", self.use_decoupled_loss)
        check_bool("recompute_logprob", self.recompute_logprob)
        check_bool("use_behave_imp_weight", self.use_behave_imp_weight)
        check_number("ppo_n_minibatches", self.ppo_n_minibatches, ge=1, integer=True)
        check_number("temperature", self.temperature, gt=0)
        check_bool("skip_zero_adv_seqs", self.skip_zero_adv_seqs)
        check_number("kl_ctl", self.kl_ctl, ge=0)

    def _check_reward_fields(self) -> None:
        """The reward-shaping keys, each on its own."""
        check_number("reward_scaling", self.reward_scaling)
        check_number("reward_bias", self.reward_bias)
        check_number("reward_clip", self.reward_clip, gt=0)
        check_number("discount", self.discount, ge=0, le=1)
        check_number("gae_lambda", self.gae_lambda, ge=0, le=1)
        check_str("adv_estimator", self.adv_estimator, optional=True)
        est = self.adv_estimator
        if est in OUTCOME_ESTIMATORS and self.kl_ctl > 0:
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
        check_bool("mask_no_eos_with_zero", self.mask_no_eos_with_zero)
        check_bool("overlong_filtering", self.overlong_filtering)
        check_bool("overlong_reward_penalty", self.overlong_reward_penalty)
        check_number("overlong_tokens", self.overlong_tokens, ge=1, integer=True, optional=True)
        check_number("overlong_penalty_factor", self.overlong_penalty_factor, ge=0, optional=True)

    def _check_loss_combinations(self) -> None:
        """Loss settings that contradict each other inside the actor."""
        if self.rejection_sampling is not None and not self.use_decoupled_loss:
            raise ConfigError(
                "rejection_sampling",
                "bounds the behaviour weight pi_prox/pi_behave of the decoupled loss, which "
                "use_decoupled_loss=false does not apply: set use_decoupled_loss=true or "
                "rejection_sampling=null",
            )
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
