"""The actor loss seam: the contract of a micro-batch loss, the library's loss, and the loader.

A custom actor loss is plugged in without subclassing or patching, either by dotted path in the
config (``actor.loss_fn: my_module:my_loss``, loaded by :func:`load_actor_loss_fn` through
:func:`areal_m2po.utils.imports.load_object`, so a broken module ends in one ``ConfigError``
line naming ``actor.loss_fn``) or as a Python object (``PPOActor(..., loss_fn=my_loss)``,
``RLTrainer(cfg, actor_loss_fn=my_loss)``).

The actor does everything around the loss (:meth:`PPOActor._microbatch_loss`): it forms the proximal
log-probs of the micro-batch (``prox_logp_method``), takes the M2PO mask (``m2_scope``) and its
stats, calls the loss function, then adds ``actor/entropy`` and ``actor/behave_kl``. The train
engine scales each micro-batch's loss by its weight over the minibatch's total weight
(``actor.loss_agg_mode``'s denominator count), so a loss that is a mean over this micro-batch's
tokens (or sequences) gives a gradient independent of the micro-batch split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from areal_m2po.algo.policy_loss import PolicyLossInputs, policy_loss
from areal_m2po.algo.ppo_loss import PPOLossSpec
from areal_m2po.api.cli_args import ActorConfig
from areal_m2po.api.errors import RunError
from areal_m2po.trainer.ppo.plan import ActorPlan, ppo_loss_spec, resolve_actor_plan
from areal_m2po.utils.imports import load_object

__all__ = [
    "ActorLossFn",
    "LossContext",
    "checked_loss_result",
    "custom_loss_name",
    "library_actor_loss",
    "load_actor_loss_fn",
    "ppo_loss_spec",
]

LossStats = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LossContext:
    """What a loss function may need besides the tensors.

    Attributes:
        config: the actor section (clip ranges, aggregation, SAPO temperatures, ...).
        max_new_tokens: the generation budget in tokens (``seq-mean-token-sum-norm``'s
            normaliser).
        step_in_update: index of the PPO minibatch within this training step (0-based).
        plan: the actor's choices (:class:`~areal_m2po.trainer.ppo.plan.ActorPlan`: which
            library loss, its clipped-PPO options, which behaviour correction), the one source
            of the loss's options; None (a context built outside an actor): resolved from
            ``config`` at construction, so it is never None afterwards.
    """

    config: ActorConfig
    max_new_tokens: int
    step_in_update: int = 0
    plan: ActorPlan | None = None

    def __post_init__(self) -> None:
        if self.plan is None:
            plan = resolve_actor_plan(self.config, self.max_new_tokens)
            object.__setattr__(self, "plan", plan)

    @property
    def ppo_spec(self) -> PPOLossSpec | None:
        """The clipped-PPO options (:attr:`ActorPlan.ppo_spec`; None with SAPO)."""
        return None if self.plan is None else self.plan.ppo_spec


class ActorLossFn(Protocol):
    """The loss of one micro-batch of ``b`` rows padded to ``T`` tokens.

    Args:
        logp: float32 ``[b, T]``, natural-log probabilities of the generated tokens under
            the policy being trained (carries the gradient; 0 outside ``loss_mask``).
        entropy: float32 ``[b, T]``, their entropies in nats (detached; report only).
        batch: the prepared micro-batch; every tensor ``[b, T]`` unless stated:

            * ``loss_mask`` (bool): the generated tokens that count;
            * ``behave_logp`` (float32): behaviour log-probs, recorded by the rollout engine
              when the tokens were sampled (0 outside ``loss_mask``);
            * ``prox_logp`` (float32, detached): proximal log-probs, the policy at the start of
              this step (or the loglinear interpolation), the ratio's denominator;
            * ``advantages`` (float32): per-token advantages, 0 outside ``loss_mask``;
            * ``m2po_mask`` (bool, True = keep): present only when M2PO is on
              (``actor.m2_threshold`` set); a token counts in the loss iff
              ``loss_mask & m2po_mask``, while the denominators keep counting every
              ``loss_mask`` token;
            * the rollout keys (``input_ids``, ``attention_mask``, ``versions``, ``rewards``
              ``[b]``, ...) as the actor received them.
        ctx: the actor config and sizes (:class:`LossContext`).

    Returns:
        ``(loss, stats)``: a scalar tensor to minimise (with gradient through ``logp``) and
        a dict of scalar tensors, logged after averaging over micro-batches and ranks
        (prefix the names, e.g. ``"my_loss/…"``).
    """

    def __call__(
        self,
        logp: torch.Tensor,
        entropy: torch.Tensor,
        batch: dict[str, torch.Tensor],
        ctx: LossContext,
    ) -> tuple[torch.Tensor, LossStats]: ...


def library_actor_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    batch: dict[str, torch.Tensor],
    ctx: LossContext,
) -> tuple[torch.Tensor, LossStats]:
    """The library's loss (:class:`ActorLossFn`): the policy-loss mode the plan names
    (:attr:`ActorPlan.loss`, :func:`~areal_m2po.algo.policy_loss.policy_loss`) with the plan's
    options, M2PO-masked. The clipped and CISPO modes take the behaviour weight the plan's
    :attr:`ActorPlan.correction` says."""
    plan = ctx.plan
    assert plan is not None  # LossContext resolves it at construction
    prox = batch["prox_logp"]
    # the behaviour weight pi_prox/pi_behave only with the decoupled loss, and there only with
    # use_behave_imp_weight (which rejection_sampling requires); passing prox as the behaviour
    # log-probs makes the weight 1 (SAPO reads none)
    behave = batch["behave_logp"] if plan.correction != "none" else prox
    inputs = PolicyLossInputs(
        logp, prox, behave, batch["advantages"], batch["loss_mask"], batch.get("m2po_mask")
    )
    return policy_loss(plan.loss, inputs, plan.loss_options)


def load_actor_loss_fn(spec: str | None) -> ActorLossFn:
    """The loss ``actor.loss_fn`` names (``"module:function"``), or the library's for None.

    Raises:
        ConfigError: ``actor.loss_fn``: one line naming the module and where it failed.
    """
    if spec is None:
        return library_actor_loss
    fn: ActorLossFn = load_object(spec, "actor.loss_fn")
    return fn


def checked_loss_result(result: object, name: str) -> tuple[torch.Tensor, dict]:
    """``result`` of the custom loss ``name`` when it is what a loss returns, ``(loss,
    stats)``: a 0-dim tensor and a dict of named statistics.

    Raises:
        RunError: one line naming ``actor.loss_fn`` and what it returned instead.
    """
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], torch.Tensor)
        and result[0].ndim == 0
        and isinstance(result[1], dict)
    ):
        return result[0], result[1]

    def shown(x: object) -> str:
        if isinstance(x, torch.Tensor):
            return f"Tensor{list(x.shape)}"
        if isinstance(x, tuple):
            return "(" + ", ".join(shown(v) for v in x[:4]) + (", ..." if len(x) > 4 else "") + ")"
        return type(x).__name__

    raise RunError(
        f"actor.loss_fn: {name} returned {shown(result)}; a loss returns (loss, stats): a "
        "0-dim tensor and a dict of named statistics"
    )


def custom_loss_name(loss_fn: ActorLossFn, configured: str | None) -> str | None:
    """A custom loss's name for the actor's plan: ``actor.loss_fn``'s dotted path, else the
    loss object's ``module:qualname``; None for :func:`library_actor_loss`."""
    if loss_fn is library_actor_loss:
        return None
    if configured is not None:
        return configured
    name = getattr(loss_fn, "__qualname__", None) or type(loss_fn).__qualname__
    return f"{getattr(loss_fn, '__module__', '?')}:{name}"
