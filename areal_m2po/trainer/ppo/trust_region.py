"""Which trust region of the actor's loss can act, read from the config alone.

The PPO clip and the SAPO gate act on the ratio ``pi_theta / pi_ref``. Whether that ratio can
leave 1 depends on where ``pi_ref`` comes from and on how many optimizer steps a batch gets:

* ``pi_ref`` is the proximal policy, the policy at the start of the training step, when
  ``actor.recompute_logprob`` is on with ``prox_logp_method=recompute`` (a forward pass at the
  step's start), and at the first minibatch also with ``prox_logp_method=loglinear`` (its
  interpolation weight is 1 there); it is the behaviour policy with ``recompute_logprob=false``.
* With ``actor.ppo_n_minibatches=1`` the step's only optimizer step evaluates the loss at the
  proximal policy itself, so a ratio against it is exactly 1 and the clip (dual clip, GSPO
  ratio) or gate never acts; from the second minibatch on it does.

On stale rollouts that leaves the loss with whatever else corrects for the staleness: the
behaviour weight ``pi_prox / pi_behave`` of the decoupled loss, or nothing.
:func:`trust_region_warnings` names these cases in one line each; the trainer logs them at
start-up. docs/m2po.md has the table of which loss terms act in each combination.

Pure: plain config values in, text out; no logging, no state.
"""

from __future__ import annotations

from areal_m2po.api.cli_args import ActorConfig, RolloutConfig

__all__ = ["NO_CLIP_RANGE", "max_lag", "trust_region_warnings"]

NO_CLIP_RANGE = 100.0
"""A clip range at least this wide on both sides is read as "no clip", the way to switch the
clip off by config: the lower bound ``1 - eps_clip`` is then at or below 0, which no ratio (a
positive number) reaches, and the upper bound ``1 + eps_clip`` is a ratio of 101 or more (a
log-ratio of 4.6), a hundredfold probability gain that one optimizer step does not make, so
the clip never binds; any narrower range can act and is reported as a clip."""


def max_lag(rollout: RolloutConfig) -> int:
    """The most policy versions a trained token may lag behind the policy being trained:
    ``rollout.staleness`` in sync mode, ``rollout.max_head_offpolicyness`` (null: 0) in async
    mode."""
    if rollout.mode == "async":
        return rollout.max_head_offpolicyness or 0
    return rollout.staleness


def _clip_configured(actor: ActorConfig) -> bool:
    """Whether the clipped-PPO loss has a clip that could act on some ratio."""
    upper = actor.eps_clip if actor.eps_clip_higher is None else actor.eps_clip_higher
    return min(actor.eps_clip, upper) < NO_CLIP_RANGE or actor.c_clip is not None


def _clip_name(actor: ActorConfig) -> str:
    """The configured clip, as the keys that set it."""
    parts = [f"actor.eps_clip={actor.eps_clip:g}"]
    if actor.eps_clip_higher is not None:
        parts.append(f"actor.eps_clip_higher={actor.eps_clip_higher:g}")
    if actor.c_clip is not None:
        parts.append(f"actor.c_clip={actor.c_clip:g}")
    return "the PPO clip (" + ", ".join(parts) + ")"


def _ratio_reason(actor: ActorConfig) -> str:
    """Why the ratio is 1 at the only optimizer step, as the keys that make it so."""
    source = (
        "actor.prox_logp_method=loglinear"
        if actor.prox_logp_method == "loglinear"
        else "actor.recompute_logprob=true"
    )
    return (
        f"with actor.ppo_n_minibatches=1 and {source} the ratio pi/pi_prox is 1 at the only "
        "optimizer step"
    )


def _behaviour_weight(actor: ActorConfig) -> str | None:
    """The behaviour weight pi_prox/pi_behave the loss applies, in words (None: none)."""
    if actor.use_sapo_loss or not actor.use_decoupled_loss:
        return None
    if actor.rejection_sampling is not None:
        return "the behaviour weight pi_prox/pi_behave (bounded by actor.rejection_sampling)"
    if actor.use_behave_imp_weight:
        return "the behaviour weight pi_prox/pi_behave"
    return None


def _fixes(actor: ActorConfig) -> str:
    """The keys that make the trust region act, for a loss with no behaviour weight."""
    many = "actor.ppo_n_minibatches>1"
    weight = "actor.use_behave_imp_weight=true (behaviour weight)"
    behave = "actor.recompute_logprob=false (ratio against the behaviour policy, no M2PO)"
    if actor.prox_logp_method == "loglinear":
        return f"set {weight} or {many}"
    if actor.use_sapo_loss:
        return f"set {behave} or {many}"
    if actor.use_decoupled_loss:
        return f"set {weight}, {behave} or {many}"
    return f"set {behave}, actor.use_decoupled_loss=true (behaviour weight) or {many}"


def _zero_width_clip(actor: ActorConfig) -> list[str]:
    """A line when a side of the PPO clip has width 0 (empty otherwise)."""
    if actor.use_sapo_loss:
        return []
    sides = (("actor.eps_clip", actor.eps_clip), ("actor.eps_clip_higher", actor.eps_clip_higher))
    zero = [f"{key}=0" for key, value in sides if value == 0]
    if not zero:
        return []
    return [
        f"{' and '.join(zero)}: a zero-width clip drops the gradient of every token whose ratio "
        "pi/pi_prox differs from 1 by rounding alone (the two log-probs come from different "
        f"forward passes); for no clip set actor.eps_clip={NO_CLIP_RANGE:g} or more"
    ]


def trust_region_warnings(actor: ActorConfig, lag: int) -> list[str]:
    """One line per configured trust region that cannot act on rollouts up to ``lag`` policy
    versions old (:func:`max_lag`), or that acts on rounding noise (a zero-width clip), naming
    the keys to change; empty when every configured term can act or the loss is a custom one
    (``actor.loss_fn``, whose terms are unknown here).

    On-policy data (``lag == 0``) gives no line for an inert clip or gate: nothing needs
    correcting there, and with one minibatch no ratio can leave 1 whatever its reference.
    """
    if actor.loss_fn is not None:
        return []
    return _zero_width_clip(actor) + _inert_trust_region(actor, lag)


def _inert_trust_region(actor: ActorConfig, lag: int) -> list[str]:
    """The line of :func:`trust_region_warnings` for a clip or gate that cannot act."""
    if lag == 0 or actor.ppo_n_minibatches > 1:
        return []
    step_start = actor.prox_logp_method == "loglinear" or actor.recompute_logprob
    if not step_start:
        return []  # the ratio is taken against the behaviour policy: the clip/gate acts
    if actor.use_sapo_loss:
        term = "the SAPO gate (actor.use_sapo_loss=true)"
    elif _clip_configured(actor):
        term = _clip_name(actor)
    else:
        return []
    stale = f"rollouts up to {lag} version{'s' if lag != 1 else ''} stale"
    weight = _behaviour_weight(actor)
    if weight is not None:
        m2po = ", with the M2PO mask" if actor.m2_threshold is not None else ""
        return [
            f"{term} does not act: {_ratio_reason(actor)}; on {stale} {weight} corrects "
            f"instead{m2po}. For the clip to act set actor.ppo_n_minibatches>1; "
            f"actor.eps_clip={NO_CLIP_RANGE:g} marks it off"
        ]
    m2po = " (only the M2PO mask acts)" if actor.m2_threshold is not None else ""
    return [
        f"{term} cannot act: {_ratio_reason(actor)}, so {stale} train an uncorrected policy "
        f"gradient{m2po}; {_fixes(actor)}"
    ]
