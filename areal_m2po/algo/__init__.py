"""The algorithm's pure tensor maths: torch only, no config objects, no state.

One concept per module, each with one public entry point (plus its helpers where named):

* :mod:`~areal_m2po.algo.m2po`: the M2PO mask (the rule, its token sets and statistics);
* :mod:`~areal_m2po.algo.policy_loss`: the policy losses as named modes (one registry, one
  signature: ppo_clip, dual_clip, decoupled, gspo, cispo, sapo);
* :mod:`~areal_m2po.algo.ppo_loss`: the clipped / decoupled PPO policy loss
  (:class:`~areal_m2po.algo.ppo_loss.PPOLossSpec`, ``ppo_actor_loss``);
* :mod:`~areal_m2po.algo.sapo_loss`: the SAPO policy loss;
* :mod:`~areal_m2po.algo.cispo_loss`: the CISPO policy loss (clipped, stop-gradient
  importance weight);
* :mod:`~areal_m2po.algo.critic_loss`: the clipped value loss;
* :mod:`~areal_m2po.algo.policy_ratio`: the token / sequence (GSPO) policy ratio;
* :mod:`~areal_m2po.algo.aggregation`: loss aggregation and a micro-batch's weight;
* :mod:`~areal_m2po.algo.rejection_sampling`: masked / truncated behaviour weights;
* :mod:`~areal_m2po.algo.advantages`: the advantage-estimator contract, the built-ins
  (grpo, gae, rloo, reinforce_pp) and GAE;
* :mod:`~areal_m2po.algo.normalization`: group / batch normalisation of rewards and advantages;
* :mod:`~areal_m2po.algo.reward_shaping`: reward transform and the DAPO overlong penalty;
* :mod:`~areal_m2po.algo.kl`: the k1/k2/k3 KL estimators;
* :mod:`~areal_m2po.algo.distill`: on-policy distillation's reverse-KL advantage and its mix
  with the task advantage;
* :mod:`~areal_m2po.algo.logp_mismatch`: the training-inference mismatch figures;
* :mod:`~areal_m2po.algo.bradley_terry`: the reward model's pairwise loss;
* :mod:`~areal_m2po.algo.sft_loss`: the supervised fine-tuning loss;
* :mod:`~areal_m2po.algo.logprobs`: chunked per-token log-probs and entropy from logits;
* :mod:`~areal_m2po.algo.options`: the option values (choice lists) and the rejection-sampling
  options' rule, torch-free, which the config tree offers as its choices;
* :mod:`~areal_m2po.algo.dpo`: the DPO / IPO preference loss and its pair log-ratios;
* :mod:`~areal_m2po.algo.reductions`, :mod:`~areal_m2po.algo.checks`: masked reductions and
  argument checks the modules above share;
* :mod:`~areal_m2po.algo.proximal`: the log-linear proximal policy (interpolation by policy
  version);
* :mod:`~areal_m2po.algo.normalization`: the one normaliser (group / batch mean and std,
  leave-one-out).

AReaL's names and calling conventions are adapters over these modules in
:mod:`areal_m2po.areal` (the AReaL wing), which nothing here imports.

Names follow one meaning each: ``behave_logp`` (behaviour log-probs, recorded while
sampling), ``prox_logp`` (proximal: the policy at the start of the step), ``logp`` (current,
differentiable), ``ref_logp`` (the reference policy). The package imports torch and itself only
(never :mod:`areal_m2po.api` or :mod:`areal_m2po.utils`; a test checks it); the config tree
imports :mod:`~areal_m2po.algo.options` from it.
"""
