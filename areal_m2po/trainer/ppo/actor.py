"""The PPO actor: proximal log-probs, advantages and the PPO/SAPO update with M2PO built in.

Where the three log-probs of a generated token come from:

* ``behave_logp`` (behaviour): recorded by the rollout engine while sampling, under the policy
  version stamped in ``versions``. Never overwritten.
* ``prox_logp`` (proximal): the policy at the start of this training step, set once per step by
  :meth:`PPOActor.prepare_proximal` (a forward pass, or the behaviour log-probs when they
  already are the proximal ones: on-policy tokens of an engine with exact log-probs, or the
  update's own forward, detached, when one minibatch makes it the step-start policy and nothing
  reads them before: :meth:`PPOActor.prox_from_update`); with
  ``prox_logp_method=loglinear`` the loss interpolates between behaviour and current log-probs
  by version instead (:meth:`PPOActor._proximal`). Which of these applies is decided once, at
  construction, in the actor's :class:`~areal_m2po.trainer.ppo.plan.ActorPlan`
  (:attr:`PPOActor.plan`), with the loss, the M2PO scope and the behaviour correction.
* the current log-probs, from the forward pass of each micro-batch.

M2PO compares behaviour with proximal, so it masks stale tokens with the clipped-PPO loss, the
decoupled loss and the SAPO loss alike. The actor owns the mask: with ``m2_scope=global``
:meth:`PPOActor.prepare_m2po` sets it (and its stats) once per PPO minibatch; with
``m2_scope=microbatch`` :meth:`PPOActor._m2po_mask` computes it inside the loss path, once per
micro-batch. The loss functions only read it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from typing import Any

import torch

from areal_m2po.algo import m2po
from areal_m2po.algo.advantages import AdvantageEstimator, AdvantageInputs
from areal_m2po.algo.aggregation import agg_loss_weight
from areal_m2po.algo.kl import kl_estimate
from areal_m2po.algo.logp_mismatch import mismatch_partials, mismatch_stats
from areal_m2po.algo.normalization import group_normalize, masked_normalize
from areal_m2po.algo.ppo_loss import PPOLossSpec
from areal_m2po.algo.proximal import loglinear_proximal
from areal_m2po.algo.reward_shaping import overlong_reward_penalty, reward_transform
from areal_m2po.api.callbacks import Phases
from areal_m2po.api.cli_args import ActorConfig, NormConfig
from areal_m2po.engine.train_engine import HFTrainEngine
from areal_m2po.trainer.ppo.adv_estimator import load_adv_estimator
from areal_m2po.trainer.ppo.loss_fn import (
    ActorLossFn,
    LossContext,
    checked_loss_result,
    custom_loss_name,
    load_actor_loss_fn,
)
from areal_m2po.trainer.ppo.plan import ActorPlan, resolve_actor_plan
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch, select_rows

logger = logging.getLogger("areal_m2po.actor")

KL_CLAMP = 10.0
"""Bound on each token's KL estimate in the KL reward penalty (AReaL's ``KLEstimator`` clamp)."""

__all__ = ["PPOActor"]


def gather_ranks(t: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """:data:`m2po.RankGather` over this run's processes: every rank's ``t`` (1-D), in rank
    order, and this rank's index."""
    everything, sizes = dist.all_gather_cat(t)
    return list(everything.split(sizes)), dist.rank()


def global_m2po_mask(
    mb: Mapping[str, torch.Tensor], m2_threshold: float, token_set: str = "all"
) -> tuple[torch.Tensor, dict[str, float]]:
    """The M2PO keep mask of this rank's rows of the minibatch ``mb`` (its ``behave_logp``,
    ``prox_logp``, ``loss_mask`` and, when it has them, ``advantages``), computed over the
    tokens of all ranks (:func:`m2po.m2po_mask` with :func:`gather_ranks`), so the mask equals
    the rule applied to the concatenated minibatch. Returns the mask (bool, like
    ``loss_mask``) and the global :func:`m2po.m2po_stats` as Python floats of their float64
    values (with ``advantages``, the quadrant stats too).
    """
    keep, stats = m2po.m2po_mask(
        mb["behave_logp"],
        mb["prox_logp"],
        mb["loss_mask"],
        m2_threshold,
        advantages=mb.get("advantages"),
        token_set=token_set,
        gather=gather_ranks,
        stats_dtype=torch.float64,
    )
    return keep, {k: float(v) for k, v in stats.items()}


class PPOActor:
    """PPO actor over an :class:`HFTrainEngine`.

    Args:
        config: the actor section.
        engine: the trainable policy.
        group_size: samples per prompt (``gconfig.n_samples``); groups are consecutive rows.
        max_new_tokens: generation budget (Dr.GRPO normaliser, overlong penalty).
        loss_fn: the micro-batch loss (:class:`~areal_m2po.trainer.ppo.loss_fn.ActorLossFn`);
            None: the one ``config.loss_fn`` names, else the library's clipped PPO / SAPO loss.
        adv_estimator: the advantage estimator
            (:data:`~areal_m2po.algo.advantages.AdvantageEstimator`); None: the one
            ``config.adv_estimator`` names (:mod:`~areal_m2po.trainer.ppo.adv_estimator`).
        has_critic: the batches carry the critic's ``values`` (critic.enabled): an unset
            ``adv_estimator`` then means gae, and gae reads them.
        phases: reports the ``m2po`` phase to step callbacks (none by default).
        exact_behave_logp: whether the rollout engine's behaviour log-probs are the trainer's
            own up to batching (``InferenceEngine.exact_logprobs``). When false, on-policy
            batches get a proximal forward pass too, so the decoupled loss corrects the
            engine's mismatch and ``rollout/logp_mismatch_*`` measures it.
        prox_read_before_update: something besides the actor reads ``batch["prox_logp"]``
            before the update (a teacher), so the proximal log-probs must come from a pass of
            their own (:meth:`prox_from_update`).
        plan: the plan the caller resolved (the trainer:
            :func:`~areal_m2po.trainer.ppo.plan.resolve_actor_plan` of ``config``, ``loss_fn``
            and the two flags above, which it then ignores); None: resolved here.

    Attributes:
        plan: every choice above and in ``config`` that shapes the update, resolved once
            (:class:`~areal_m2po.trainer.ppo.plan.ActorPlan`); the methods read it.
    """

    def __init__(
        self,
        config: ActorConfig,
        engine: HFTrainEngine,
        group_size: int,
        max_new_tokens: int,
        *,
        loss_fn: ActorLossFn | None = None,
        adv_estimator: AdvantageEstimator | None = None,
        has_critic: bool = False,
        phases: Phases | None = None,
        exact_behave_logp: bool = True,
        prox_read_before_update: bool = False,
        plan: ActorPlan | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.loss_fn = loss_fn if loss_fn is not None else load_actor_loss_fn(config.loss_fn)
        if plan is None:
            plan = resolve_actor_plan(
                config,
                max_new_tokens,
                custom_loss=custom_loss_name(self.loss_fn, config.loss_fn),
                exact_behave_logp=exact_behave_logp,
                prox_read_before_update=prox_read_before_update,
            )
        self.plan: ActorPlan = plan
        self.has_critic = has_critic
        if adv_estimator is None:
            adv_estimator = load_adv_estimator(
                config.adv_estimator, critic=has_critic, kl_penalty=config.kl_ctl > 0
            )
        self.adv_estimator = adv_estimator
        self.phases = phases if phases is not None else Phases()
        self._warned_no_m2po = False
        self._high_mask_streak = 0
        self._prox_from_update_now = False  # this step's proximal log-probs: the update's

    @property
    def exact_behave_logp(self) -> bool:
        """Whether the rollout engine's log-probs are the trainer's own (the plan's)."""
        return self.plan.exact_behave_logp

    @property
    def loss_spec(self) -> PPOLossSpec | None:
        """The clipped-PPO loss options (the plan's; None with SAPO); rejection sampling only
        with the decoupled loss."""
        return self.plan.ppo_spec

    def state_dict(self) -> dict[str, int | bool]:
        """The actor's own state besides its engine's (recover checkpoints): the run of steps
        with a high M2PO masked fraction and whether the inert-M2PO warning was given."""
        return {"high_mask_streak": self._high_mask_streak, "warned_no_m2po": self._warned_no_m2po}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self._high_mask_streak = int(state["high_mask_streak"])
        self._warned_no_m2po = bool(state["warned_no_m2po"])

    # -- log-probs ----------------------------------------------------------------------------

    def compute_logp(self, batch: Batch) -> torch.Tensor:
        """Log-probs of the generated tokens under the current policy, float32 [B, T]."""
        logp, _ = self.engine.forward_tokens(batch, self.config.temperature)
        return logp

    def prepare_proximal(self, batch: Batch) -> dict[str, float]:
        """Set ``batch["prox_logp"]`` (float32 ``[B, T]``), once per training step, before the
        advantages; everything downstream (KL reward, M2PO, the losses) reads it. Returns the
        ``rollout/logp_mismatch_*`` stats of :meth:`logp_mismatch` when a forward pass was made
        (empty otherwise).

        * ``recompute_logprob`` with ``prox_logp_method=recompute``: a forward pass of the policy
          at step start, skipped when every valid token was generated by that very policy
          (``versions == engine.version``) and the engine's log-probs are exact
          (:attr:`exact_behave_logp`): its behaviour log-probs then are the proximal ones
          (equal to a recompute within fp tolerance).
        * no pass either when :meth:`prox_from_update` (one minibatch, nothing reads them
          before the update) and the batch holds no token of the current version: the key
          is left out, and the update takes the log-probs of its own forward, detached.
        * otherwise the behaviour log-probs. With ``loglinear`` the loss forms the proximal
          log-probs per micro-batch (:meth:`_proximal`); without ``recompute_logprob``
          M2PO cannot mask anything (prox = behave), which is warned once.
        """
        plan = self.plan
        behave = batch["behave_logp"]
        self._prox_from_update_now = False
        if plan.prox_source == "recompute":
            current = batch["versions"][batch["loss_mask"]] == self.engine.version
            on_policy = plan.prox_reuse_behave and bool(current.all())
            # one decision for all ranks (a sharded model's forward is a collective)
            votes = torch.tensor([float(not on_policy), float(bool(current.any()))])
            forward, any_current = dist.all_reduce_max(votes).tolist()
            if not forward:
                batch["prox_logp"] = behave
                return {}
            if plan.prox_from_update and not any_current:
                batch.pop("prox_logp", None)
                self._prox_from_update_now = True  # the update's forward gives them (_proximal)
                return {}
            batch["prox_logp"] = self.compute_logp(batch)
            return self.logp_mismatch(batch, batch["prox_logp"])
        batch["prox_logp"] = behave
        if plan.m2po_inert and not self._warned_no_m2po:
            logger.warning(
                "M2PO is on (actor.m2_threshold=%s) but actor.recompute_logprob=false makes the "
                "proximal log-probs equal the behaviour ones: M2PO cannot mask anything",
                plan.m2_threshold,
            )
            self._warned_no_m2po = True
        return {}

    def prox_from_update(self) -> bool:
        """Whether the proximal log-probs may come from the update's own forward (detached)
        instead of a pass of their own. The proximal policy is the one at the start of the
        step, and with one PPO minibatch the update's only forward runs that very policy, so
        its log-probs are the proximal ones; it applies when nothing reads them before that
        forward: M2PO off or per micro-batch (``m2_scope=global`` masks the whole minibatch
        first), no KL reward on the proximal log-probs, no teacher
        (``prox_read_before_update``). :meth:`prepare_proximal` also keeps the pass when
        the batch holds tokens of the current version (its ``rollout/logp_mismatch_*``).
        Decided at construction (:attr:`plan`)."""
        return self.plan.prox_from_update

    def logp_mismatch(self, batch: Batch, trainer_logp: torch.Tensor) -> dict[str, float]:
        """The training-inference mismatch (:mod:`~areal_m2po.algo.logp_mismatch`) between
        ``batch["behave_logp"]`` and ``trainer_logp`` (float ``[B, T]``, the policy's log-probs at
        ``engine.version``) over the valid tokens generated by that version, on all ranks:
        ``rollout/logp_mismatch_{abs_mean,abs_max,kl,tokens}``; empty when no such token.
        Every rank calls it (two all-reduces)."""
        mask = batch["loss_mask"] & (batch["versions"] == self.engine.version)
        sums, maxes = mismatch_partials(batch["behave_logp"], trainer_logp, mask)
        figures = mismatch_stats(dist.all_reduce_sum(sums), dist.all_reduce_max(maxes))
        return {f"rollout/logp_mismatch_{k}": v for k, v in figures.items()}

    # -- advantages ---------------------------------------------------------------------------

    def _norm_kwargs(self, norm: NormConfig) -> dict[str, Any]:
        """The keyword arguments of the functional normalisers for a NormConfig section."""
        return {
            "mean_level": norm.mean_level,
            "std_level": norm.std_level,
            "group_size": norm.group_size or self.group_size,
            "mean_leave1out": norm.mean_leave1out,
            "std_unbiased": norm.std_unbiased,
            "eps": norm.eps,
        }

    def _normalize_scores(self, scores: torch.Tensor, norm: NormConfig) -> torch.Tensor:
        """Normalise sequence scores [B] with group statistics (local) or batch ones (global).

        Batch-level statistics gather every rank's scores, normalise the concatenation and keep
        this rank's slice; groups never span ranks, so group statistics stay local.
        """
        offset = 0
        if "batch" in (norm.mean_level, norm.std_level) and dist.is_distributed():
            scores_all, sizes = dist.all_gather_cat(scores)
            offset = sum(sizes[: dist.rank()])
        else:
            scores_all = scores
        normed = group_normalize(scores_all, **self._norm_kwargs(norm))
        return normed[offset : offset + scores.numel()]

    def _sequence_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Each row's score [B] from its reward, in AReaL's order: overlong penalty on the raw
        reward, then ``clip((r + bias) * scaling)``, then ``reward_norm``, then (with
        ``mask_no_eos_with_zero``) 0 for truncated rows."""
        c = self.config
        rewards = batch["rewards"].float()
        # over all ranks (dynamic filtering leaves ranks different numbers of rows)
        raw = dist.all_reduce_sum(
            torch.tensor([float(rewards.sum()), float(rewards.numel())], dtype=torch.float64)
        )
        stats: dict[str, float] = {"reward/raw_mean": float(raw[0] / raw[1]) if raw[1] else 0.0}
        if c.overlong_reward_penalty:
            assert c.overlong_tokens is not None and c.overlong_penalty_factor is not None
            rewards = overlong_reward_penalty(
                rewards,
                batch["loss_mask"].sum(-1),
                c.overlong_tokens,
                c.overlong_penalty_factor,
                self.max_new_tokens,
            )
        scores = reward_transform(rewards, c.reward_scaling, c.reward_bias, c.reward_clip)
        if c.reward_norm is not None:
            scores = self._normalize_scores(scores, c.reward_norm)
        if c.mask_no_eos_with_zero:
            scores = torch.where(batch["no_eos"], torch.zeros_like(scores), scores)
        return scores, stats

    def _kl_penalty(self, batch: Batch, mask_f: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The per-token KL reward ``-kl_ctl * KL(policy || ref)`` (float32 ``[B, T]``, 0
        outside the loss mask) and the mean KL over all ranks' valid tokens (``actor/kl_ref``)."""
        c = self.config
        policy_logp = batch["behave_logp"] if c.kl_logp == "behave" else batch["prox_logp"]
        kl = kl_estimate(policy_logp, batch["ref_logp"], c.kl_estimator, clamp=KL_CLAMP)
        kl = kl * mask_f
        kl_tot = dist.all_reduce_sum(torch.stack([kl.sum(), mask_f.sum()]).double())
        return torch.zeros_like(mask_f) - c.kl_ctl * kl, float(kl_tot[0] / kl_tot[1].clamp(min=1))

    def _estimator_inputs(self, batch: Batch, scores: torch.Tensor) -> AdvantageInputs:
        """What :attr:`adv_estimator` gets (:class:`AdvantageInputs`); KL stats aside."""
        c = self.config
        loss_mask = batch["loss_mask"]
        if self.has_critic and "values" not in batch:
            raise KeyError("has_critic: the batch has no 'values' (the critic's, for gae)")
        n_rows = int(loss_mask.shape[0])
        return AdvantageInputs(
            scores=scores,
            loss_mask=loss_mask,
            group_size=self.group_size if n_rows % self.group_size == 0 else 1,
            values=batch["values"] if self.has_critic else None,
            discount=c.discount,
            gae_lambda=c.gae_lambda,
            batch_sum=dist.all_reduce_sum if dist.is_distributed() else None,
        )

    def compute_advantages(self, batch: Batch) -> dict[str, float]:
        """Fill ``batch["advantages"]`` (and ``batch["returns"]``), float32 [B, T].

        Rows get scores (:meth:`_sequence_scores`); ``overlong_filtering`` first takes the
        truncated rows out of ``batch["loss_mask"]``; with ``kl_ctl > 0`` each token gets the KL
        penalty as its reward. :attr:`adv_estimator` (``actor.adv_estimator``) turns them into
        advantages: one per sequence (``[B]``: ``adv_norm`` normalises the scores, each
        sequence counting once, ``adv_norm_weighting=sequence``, or each token, ``token``,
        AReaL; every valid token carries its row's) or one per token (``[B, T]``: ``adv_norm``
        normalises the token advantages).
        """
        c = self.config
        scores, stats = self._sequence_scores(batch)
        if c.overlong_filtering:
            batch["loss_mask"] = batch["loss_mask"] & ~batch["no_eos"][:, None]
        loss_mask = batch["loss_mask"]
        mask_f = loss_mask.float()
        inputs = self._estimator_inputs(batch, scores)
        if c.kl_ctl > 0 and "ref_logp" in batch:
            token_rewards, stats["actor/kl_ref"] = self._kl_penalty(batch, mask_f)
            inputs = dataclasses.replace(inputs, token_rewards=token_rewards)
        adv, returns = self.adv_estimator(inputs)
        norm = c.adv_norm
        if adv.ndim == 1:  # one advantage per sequence
            if norm is not None and c.adv_norm_weighting == "token":
                per_token = adv[:, None].expand_as(mask_f)
                kwargs = self._norm_kwargs(norm)
                adv = masked_normalize(per_token, loss_mask, **kwargs, batch_sum=inputs.batch_sum)
            else:
                if norm is not None:
                    adv = self._normalize_scores(adv, norm)
                adv = adv[:, None] * mask_f
            batch["advantages"] = adv
            batch["returns"] = adv.clone() if returns is None else returns * mask_f
            return stats
        returns = adv if returns is None else returns
        if norm is not None:
            kwargs = self._norm_kwargs(norm)
            adv = masked_normalize(adv, loss_mask, **kwargs, batch_sum=inputs.batch_sum)
        batch["advantages"] = adv * mask_f
        batch["returns"] = returns * mask_f
        return stats

    # -- update -------------------------------------------------------------------------------

    def _minibatch_rows(self, n_rows: int, k: int | None = None) -> list[torch.Tensor]:
        """Row indices of each PPO minibatch (``k``, default ``ppo_n_minibatches``, or fewer
        when there are fewer groups): contiguous runs of whole groups.

        Rows form groups of ``group_size`` consecutive samples; when dynamic filtering or a
        custom batch breaks that, every row is its own group.
        """
        per_group = self.group_size if n_rows % self.group_size == 0 else 1
        n_groups = n_rows // per_group
        k = min(self.config.ppo_n_minibatches if k is None else k, n_groups)
        bounds = [round(i * n_groups / k) * per_group for i in range(k + 1)]
        return [torch.arange(bounds[i], bounds[i + 1]) for i in range(k)]

    def _loss_weight(self, mb: Batch) -> float:
        """The micro-batch's weight: exactly its ``agg_loss`` denominator count, so the step's
        gradient depends neither on the micro-batch split nor on skipped zero-advantage rows."""
        return float(agg_loss_weight(mb["loss_mask"], self.config.loss_agg_mode))

    def _proximal(self, mb: Batch, logp: torch.Tensor, step_in_update: int) -> torch.Tensor:
        """Proximal log-probs of a micro-batch [b, T] (detached)."""
        if self.plan.prox_source == "loglinear":
            v_prox = float(self.engine.version)
            return loglinear_proximal(
                mb["behave_logp"], logp, mb["versions"], v_prox, v_prox + step_in_update
            )
        if self._prox_from_update_now:  # prepare_proximal left them to this forward
            return logp.detach()
        return mb["prox_logp"]

    def prepare_m2po(self, mb: Batch) -> dict[str, float]:
        """With ``m2_scope=global``: set ``mb["m2po_mask"]`` (bool ``[b, T]``), the M2PO mask of
        this PPO minibatch taken over its tokens on all ranks, and return its ``m2po/*`` stats.
        Other settings: nothing to do here (empty stats)."""
        plan = self.plan
        if plan.m2po != "global":
            return {}
        assert plan.m2_threshold is not None
        with self.phases("m2po"):
            mb["m2po_mask"], stats = global_m2po_mask(mb, plan.m2_threshold, plan.m2_token_set)
        return stats

    def _m2po_mask(
        self, mb: Batch, prox: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """The M2PO keep mask of a micro-batch (None without M2PO) and the stats it adds: the
        minibatch's mask from :meth:`prepare_m2po` (``m2_scope=global``; its stats were taken
        there), or the rule over this micro-batch with ``prox`` (``m2_scope=microbatch``)."""
        plan = self.plan
        if not plan.m2po_on:
            return None, {}
        assert plan.m2_threshold is not None
        if plan.m2po == "global":
            if "m2po_mask" not in mb:
                raise KeyError(
                    "m2_scope=global: the micro-batch has no 'm2po_mask'; "
                    "PPOActor.prepare_m2po(minibatch) sets it before the micro-batches"
                )
            return mb["m2po_mask"], {}
        with self.phases("m2po"):
            return m2po.m2po_mask(
                mb["behave_logp"],
                prox,
                mb["loss_mask"],
                plan.m2_threshold,
                advantages=mb.get("advantages"),
                token_set=plan.m2_token_set,
            )

    def _microbatch_loss(
        self, logp: torch.Tensor, entropy: torch.Tensor, mb: Batch, step_in_update: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch loss the train engine calls: proximal log-probs and the M2PO mask
        (with their stats), then :attr:`loss_fn` on the prepared micro-batch (the
        :class:`~areal_m2po.trainer.ppo.loss_fn.ActorLossFn` contract), then the entropy and
        behaviour-KL stats (``actor/loss``: the loss's value)."""
        prox = self._proximal(mb, logp, step_in_update)
        m2po_mask, stats = self._m2po_mask(mb, prox)
        prepared = {k: v for k, v in mb.items() if k != "m2po_mask"}
        prepared["prox_logp"] = prox
        if m2po_mask is not None:
            prepared["m2po_mask"] = m2po_mask
        ctx = LossContext(self.config, self.max_new_tokens, step_in_update, self.plan)
        result = self.loss_fn(logp, entropy, prepared, ctx)
        if self.plan.custom_loss is not None:  # the user's code: its result checked
            result = checked_loss_result(result, self.plan.custom_loss)
        loss, loss_stats = result
        stats.update(loss_stats)
        stats["actor/loss"] = loss.detach()
        loss_mask = mb["loss_mask"]
        n_valid = loss_mask.sum().clamp(min=1)
        stats["actor/entropy"] = (entropy * loss_mask).sum().detach() / n_valid
        stats["actor/behave_kl"] = ((mb["behave_logp"] - prox) * loss_mask).sum().detach() / n_valid
        return loss, stats

    def ppo_update(self, batch: Batch) -> dict[str, float]:
        """PPO/SAPO update over ``batch``: ``ppo_n_minibatches`` optimizer steps.

        ``batch`` needs the rollout keys plus ``prox_logp`` (:meth:`prepare_proximal`) and
        ``advantages``. Returns the step's stats, averaged over minibatches.
        """
        c = self.config
        totals: dict[str, float] = {}
        n_rows = int(batch["input_ids"].shape[0])
        minibatches = self._minibatch_rows(n_rows)
        if dist.is_distributed():
            # every rank must take the same optimizer steps, but dynamic filtering can leave a
            # rank fewer groups than minibatches: all ranks use the smallest count
            fewest = -int(dist.all_reduce_max(torch.tensor([-len(minibatches)]))[0])
            if fewest < len(minibatches):
                minibatches = self._minibatch_rows(n_rows, fewest)
        for k, rows in enumerate(minibatches):
            mb = select_rows(batch, rows)
            mb_stats = self.prepare_m2po(mb)
            # the denominator is fixed over the whole minibatch (all ranks) before any row is
            # skipped, so skipping zero-advantage rows leaves the gradient unchanged
            total = float(
                dist.all_reduce_sum(torch.tensor(self._loss_weight(mb), dtype=torch.float64))
            )
            # a micro-batch-scoped M2PO statistic is taken over the rows the micro-batch holds,
            # so rows may only be skipped when the mask was fixed over the whole minibatch
            m2_needs_all_rows = self.plan.m2po == "microbatch"
            if c.skip_zero_adv_seqs and not m2_needs_all_rows:
                nonzero = ((mb["advantages"] != 0) & mb["loss_mask"]).any(-1)
                # set on every rank (summed over ranks below), so all ranks hold the same keys
                mb_stats["actor/skipped_zero_adv_seqs"] = float(
                    mb["input_ids"].shape[0] - int(nonzero.sum())
                )
                if not bool(nonzero.all()):
                    keep_rows = torch.nonzero(nonzero).flatten()
                    if keep_rows.numel() == 0:
                        keep_rows = torch.tensor([0])  # every rank must take part in the step
                    mb = select_rows(mb, keep_rows)
            train_stats, loss_stats = self.engine.train_batch(
                mb,
                microbatch_loss=functools.partial(self._microbatch_loss, step_in_update=k),
                loss_weight_fn=self._loss_weight,
                temperature=c.temperature,
                total_weight=total,
            )
            mb_stats.update(loss_stats)
            mb_stats["actor/grad_norm"] = train_stats["grad_norm"]
            mb_stats["actor/lr"] = train_stats["lr"]
            mb_stats["actor/skipped_steps"] = train_stats["skipped"]
            # no loss-mask token in the minibatch on any rank: no optimizer step (averaged over
            # the minibatches like skipped_steps: the fraction of this update's steps)
            mb_stats["actor/empty_steps"] = train_stats["empty"]
            for key, v in mb_stats.items():
                totals[key] = totals.get(key, 0.0) + v / len(minibatches)
        # train_batch's loss stats and the global M2PO stats are already global; only the
        # count of skipped rows is per rank
        out = dict(totals)
        key = "actor/skipped_zero_adv_seqs"
        if key in out:
            out[key] = float(dist.all_reduce_sum(torch.tensor([out[key]], dtype=torch.float64))[0])
        self.engine.version += 1
        self._check_masked_fraction(out)
        return out

    def _check_masked_fraction(self, stats: dict[str, float]) -> None:
        frac = stats.get("m2po/masked_fraction")
        if frac is None:
            return
        c = self.config
        if frac >= 0.9:
            logger.warning(
                "M2PO masked %.0f%% of the tokens: actor.m2_threshold=%s is too low for these "
                "rollouts; raise it (the paper uses 0.04)",
                100 * frac,
                self.plan.m2_threshold,
            )
        if frac > c.m2_warn_masked_fraction:
            self._high_mask_streak += 1
            if self._high_mask_streak == 3:
                logger.warning(
                    "M2PO has masked more than %.0f%% of the tokens for 3 steps in a row (now "
                    "%.0f%%): raise actor.m2_threshold (now %s) to train on more tokens, or lower "
                    "rollout.staleness",
                    100 * c.m2_warn_masked_fraction,
                    100 * frac,
                    self.plan.m2_threshold,
                )
        else:
            self._high_mask_streak = 0
