"""The actor's choices, made once: which loss, where the proximal log-probs come from, M2PO's
scope and the behaviour correction (:class:`ActorPlan`, :func:`resolve_actor_plan`).

The actor section spreads one choice over several keys (the loss over ``use_sapo_loss``,
``use_cispo_loss``, ``use_decoupled_loss`` and ``loss_fn``; the proximal source over
``recompute_logprob``, ``prox_logp_method``, ``ppo_n_minibatches``, the KL reward and whether a
teacher reads the proximal log-probs; M2PO over ``m2_threshold`` and ``m2_scope``). The trainer
refuses contradictions before any model loads (:func:`check_actor_plan`), resolves the plan
once when it builds the actor and hands it over (an actor built alone resolves its own); the
actor's methods and the loss read the plan, and :meth:`ActorPlan.describe` is the start-up
line that prints it. Pure: config values in, a frozen value out; no logging.
"""

from __future__ import annotations

from dataclasses import dataclass

from areal_m2po.algo.policy_loss import CUSTOM, POLICY_LOSSES, PolicyLossOptions
from areal_m2po.algo.ppo_loss import PPOLossSpec
from areal_m2po.algo.rejection_sampling import RejectionSampling
from areal_m2po.api.cli_args import ActorConfig, ConfigError

__all__ = [
    "ActorPlan",
    "check_actor_plan",
    "policy_loss_mode",
    "policy_loss_options",
    "ppo_loss_spec",
    "resolve_actor_plan",
]

LOSSES = tuple(POLICY_LOSSES)  # the library's modes (algo/policy_loss.py)
PROX_SOURCES = ("recompute", "loglinear", "behave")
M2PO_SCOPES = ("off", "global", "microbatch")
CORRECTIONS = ("none", "behave_weight", "rejection_sampling")


@dataclass(frozen=True)
class ActorPlan:
    """What the actor does, decided once from its config and what the trainer knows.

    Attributes:
        loss: the library's policy-loss mode the section selects (:func:`policy_loss_mode`,
            one of :data:`~areal_m2po.algo.policy_loss.POLICY_LOSSES`); what
            :func:`~areal_m2po.trainer.ppo.loss_fn.library_actor_loss` computes (a custom loss
            may call it too).
        custom_loss: the custom loss the actor calls instead (``actor.loss_fn``'s dotted path
            or the loss object's qualified name); None: the library's.
        importance_sampling_level: ``token`` (PPO) or ``sequence`` (GSPO).
        c_clip: the dual-clip constant (None: off).
        loss_options: the options of the loss (:func:`policy_loss_options`): the clipped-PPO
            options (:attr:`ppo_spec`; None with SAPO, which takes none), the aggregation and
            SAPO's temperatures.
        prox_source: ``recompute`` (a forward pass of the step-start policy), ``loglinear``
            (interpolated per micro-batch between behaviour and current log-probs by version)
            or ``behave`` (the behaviour log-probs: ``recompute_logprob=false``).
        prox_reuse_behave: with ``recompute``: an on-policy batch reuses its behaviour
            log-probs (the rollout engine's log-probs are exact, ``exact_behave_logp``).
        prox_from_update: with ``recompute``: a stale batch takes the update's own forward,
            detached (one minibatch; nothing reads the log-probs before the update).
        m2po: ``off``, ``global`` (one mask per PPO minibatch over all ranks) or ``microbatch``.
        m2_threshold: M2PO's threshold (None when off).
        m2_token_set: the tokens M2PO's rule takes (``all`` / ``trust_region``).
        correction: the behaviour correction of the library's clipped / CISPO loss: ``none``,
            ``behave_weight`` (pi_prox / pi_behave) or ``rejection_sampling`` (that weight,
            bounded); ``none`` for SAPO; a custom loss reads its own.
        exact_behave_logp: the rollout engine's log-probs are the trainer's own.
        prox_read_before_update: something besides the actor (a teacher) reads the proximal
            log-probs before the update.
    """

    loss: str
    custom_loss: str | None
    importance_sampling_level: str
    c_clip: float | None
    loss_options: PolicyLossOptions
    prox_source: str
    prox_reuse_behave: bool
    prox_from_update: bool
    m2po: str
    m2_threshold: float | None
    m2_token_set: str
    correction: str
    exact_behave_logp: bool
    prox_read_before_update: bool

    @property
    def ppo_spec(self) -> PPOLossSpec | None:
        """The clipped-PPO options handed to the loss (None with SAPO)."""
        return self.loss_options.ppo

    @property
    def mode(self) -> str:
        """The policy-loss mode the actor runs: :attr:`loss`, or ``custom`` with a custom
        loss (one of :data:`~areal_m2po.algo.policy_loss.MODES`)."""
        return CUSTOM if self.custom_loss is not None else self.loss

    @property
    def m2po_on(self) -> bool:
        """Whether M2PO masks tokens."""
        return self.m2po != "off"

    @property
    def m2po_inert(self) -> bool:
        """M2PO is on but the proximal log-probs are the behaviour ones: it masks nothing."""
        return self.m2po_on and self.prox_source == "behave"

    def m2po_text(self) -> str:
        """M2PO as the trainer's start-up line words it."""
        if not self.m2po_on:
            return "off"
        return f"m2_threshold={self.m2_threshold} ({self.m2po})"

    def describe(self) -> str:
        """The plan in one line (the start-up log)."""
        loss = self.loss if self.custom_loss is None else f"custom {self.custom_loss}"
        if self.loss != "sapo":
            loss += f" ({self.importance_sampling_level}-level ratio"
            loss += f", c_clip={self.c_clip})" if self.c_clip is not None else ")"
        prox = self.prox_source
        if prox == "recompute":
            shortcuts = []
            if self.prox_reuse_behave:
                shortcuts.append("behaviour log-probs on on-policy batches")
            if self.prox_from_update:
                shortcuts.append("the update's forward on stale batches")
            prox += f" (reusing {' and '.join(shortcuts)})" if shortcuts else " (every step)"
        m2po = self.m2po_text()
        if self.m2po_on:
            m2po += f", tokens={self.m2_token_set}" + (" (inert)" if self.m2po_inert else "")
        return f"loss={loss}; proximal={prox}; M2PO={m2po}; behaviour correction={self.correction}"


def ppo_loss_spec(config: ActorConfig, max_new_tokens: int | None) -> PPOLossSpec:
    """The clipped-PPO loss options of an actor section, unpacked into plain values (the maths
    takes no config object); rejection sampling only applies with the decoupled loss.
    ``max_new_tokens`` is the Dr. GRPO normaliser (the generation budget)."""
    rs = config.rejection_sampling if config.use_decoupled_loss else None
    return PPOLossSpec(
        eps_clip=config.eps_clip,
        eps_clip_higher=config.eps_clip_higher,
        c_clip=config.c_clip,
        rejection_sampling=None
        if rs is None
        else RejectionSampling(rs.level, rs.action, rs.metric, rs.agg, rs.upper, rs.lower),
        importance_sampling_level=config.importance_sampling_level,
        loss_agg_mode=config.loss_agg_mode,
        max_tokens_norm=max_new_tokens,
    )


def policy_loss_mode(config: ActorConfig) -> str:
    """The library's policy-loss mode (:mod:`~areal_m2po.algo.policy_loss`) the actor section's
    keys select, the most specific first: ``sapo`` (``use_sapo_loss``), ``cispo``
    (``use_cispo_loss``), ``gspo`` (``importance_sampling_level=sequence``), ``decoupled``
    (``use_decoupled_loss``), ``dual_clip`` (``c_clip`` set), else ``ppo_clip``. The clipped
    modes combine: their options (:func:`ppo_loss_spec`) carry every key that is set."""
    c = config
    if c.use_sapo_loss:
        return "sapo"
    if c.use_cispo_loss:
        return "cispo"
    if c.importance_sampling_level == "sequence":
        return "gspo"
    if c.use_decoupled_loss:
        return "decoupled"
    return "dual_clip" if c.c_clip is not None else "ppo_clip"


def policy_loss_options(config: ActorConfig, max_new_tokens: int | None) -> PolicyLossOptions:
    """The loss options of an actor section: the clipped-PPO options (:func:`ppo_loss_spec`;
    none with SAPO), the aggregation and SAPO's gate temperatures."""
    return PolicyLossOptions(
        ppo=None if config.use_sapo_loss else ppo_loss_spec(config, max_new_tokens),
        loss_agg_mode=config.loss_agg_mode,
        max_tokens_norm=max_new_tokens,
        sapo_tau_pos=config.sapo_tau_pos,
        sapo_tau_neg=config.sapo_tau_neg,
    )


def _correction(c: ActorConfig) -> str:
    """The behaviour weight the library's clipped / CISPO loss applies (none for SAPO)."""
    if c.use_sapo_loss or not (c.use_decoupled_loss and c.use_behave_imp_weight):
        return "none"
    return "rejection_sampling" if c.rejection_sampling is not None else "behave_weight"


def check_actor_plan(config: ActorConfig, *, custom_loss: str | None = None) -> None:
    """Refuse an actor section whose keys contradict each other (run before any model loads;
    :func:`resolve_actor_plan` runs it too).

    Raises:
        ConfigError: ``actor.rejection_sampling`` without ``use_decoupled_loss`` and without a
            custom loss (the library's loss would drop it).
    """
    if (
        config.rejection_sampling is not None
        and not config.use_decoupled_loss
        and custom_loss is None
    ):
        raise ConfigError(
            "rejection_sampling",
            "bounds the behaviour weight of the decoupled loss, which is off: set "
            "actor.use_decoupled_loss=true or actor.rejection_sampling=null",
        )


def resolve_actor_plan(
    config: ActorConfig,
    max_new_tokens: int | None,
    *,
    custom_loss: str | None = None,
    exact_behave_logp: bool = True,
    prox_read_before_update: bool = False,
) -> ActorPlan:
    """The :class:`ActorPlan` of an actor section.

    Args:
        config: the actor section.
        max_new_tokens: the generation budget (the Dr. GRPO normaliser of the PPO options).
        custom_loss: the custom loss's name (``actor.loss_fn`` or the object's), None for
            the library's.
        exact_behave_logp: the rollout engine's log-probs are the trainer's own
            (``InferenceEngine.exact_logprobs``).
        prox_read_before_update: a teacher reads the proximal log-probs before the update.

    Raises:
        ConfigError: from :func:`check_actor_plan`.
    """
    c = config
    check_actor_plan(c, custom_loss=custom_loss)
    if c.prox_logp_method == "loglinear":
        prox = "loglinear"
    else:
        prox = "recompute" if c.recompute_logprob else "behave"
    m2po = "off" if c.m2_threshold is None else c.m2_scope
    from_update = (
        prox == "recompute"
        and c.ppo_n_minibatches == 1
        and m2po != "global"
        and not (c.kl_ctl > 0 and c.kl_logp == "proximal")
        and not prox_read_before_update
    )
    return ActorPlan(
        loss=policy_loss_mode(c),
        custom_loss=custom_loss,
        importance_sampling_level=c.importance_sampling_level,
        c_clip=c.c_clip,
        loss_options=policy_loss_options(c, max_new_tokens),
        prox_source=prox,
        prox_reuse_behave=prox == "recompute" and exact_behave_logp,
        prox_from_update=from_update,
        m2po=m2po,
        m2_threshold=c.m2_threshold,
        m2_token_set=c.m2_token_set,
        correction=_correction(c),
        exact_behave_logp=exact_behave_logp,
        prox_read_before_update=prox_read_before_update,
    )
