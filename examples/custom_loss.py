"""Write your own actor loss from the library's M2PO helper and PPO/SAPO loss functions.

AReaL users customise the policy loss by writing a function like AReaL's ``grpo_loss_fn``:
take a micro-batch, apply ``_apply_m2po_masking`` to its loss mask, call ``ppo_actor_loss_fn``
or ``sapo_loss_fn``, add their own terms. The same pieces are importable here:

    from areal_m2po.trainer.ppo.actor import PPOActor, _apply_m2po_masking
    from areal_m2po.utils.functional import ppo_actor_loss_fn, sapo_loss_fn

``m2po_loss_fn`` below rebuilds the library's actor loss from those pieces and adds one term of
its own: ``behave_k2_coef`` times the mean of ``0.5 * (logp - behave_logp)^2`` over the tokens
M2PO kept, a k2 estimate of the KL divergence to the behaviour policy that generated the batch
(a soft trust region on stale data). With ``behave_k2_coef=0`` it is exactly the library's loss.
``CustomLossActor`` plugs it into training by overriding ``PPOActor._loss_fn``, the function the
train engine calls on every micro-batch.

    python examples/custom_loss.py --tiny           # tiny random model, 2 steps, seconds
    python examples/custom_loss.py --tiny --behave-k2-coef 0.5

The script first checks its loss against the library's on a random micro-batch (same value,
same gradient), then trains with ``CustomLossActor``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

import torch

from areal_m2po.api.cli_args import (
    ActorConfig,
    DatasetConfig,
    EvaluatorConfig,
    GenerationConfig,
    OptimizerConfig,
    PPOConfig,
    RewardConfig,
    RolloutConfig,
    SaverConfig,
)
from areal_m2po.trainer.ppo.actor import PPOActor, _apply_m2po_masking
from areal_m2po.utils.functional import m2po_stats, ppo_actor_loss_fn, sapo_loss_fn

Batch = dict[str, torch.Tensor]
HERE = os.path.dirname(os.path.abspath(__file__))


def m2po_loss_fn(
    logprobs: torch.Tensor,
    entropy: torch.Tensor,
    input_data: Batch,
    *,
    config: ActorConfig,
    max_new_tokens: int,
    proximal_logprobs: torch.Tensor | None = None,
    behave_k2_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The actor loss of one micro-batch: M2PO mask, then the clipped PPO or the SAPO loss.

    Args:
        logprobs: ``[b, T]`` log-probs of the generated tokens under the policy being trained
            (with gradient).
        entropy: ``[b, T]`` their entropies (no gradient; only reported).
        input_data: the micro-batch: ``logprobs`` (behaviour, recorded at generation),
            ``prox_logp`` (policy at step start), ``loss_mask``, ``advantages``, and
            ``m2po_mask`` when the actor already computed a global mask (``m2_scope=global``).
        config: the actor section (threshold, loss choice, clip ranges, ...).
        max_new_tokens: the generation budget (normaliser of ``seq-mean-token-sum-norm``).
        proximal_logprobs: overrides ``input_data["prox_logp"]`` (e.g. loglinear proximal).
        behave_k2_coef: weight of the extra ``0.5 (logp - behave)^2`` term (0: library loss).
    """
    c = config
    loss_mask = input_data["loss_mask"]
    behave = input_data["logprobs"]
    prox = proximal_logprobs
    if prox is None:
        prox = input_data.get("prox_logp", behave)
    stats: dict[str, torch.Tensor] = {}

    # M2PO: a global mask (whole minibatch, all ranks) arrives with the micro-batch; otherwise
    # take the statistic over this micro-batch, as AReaL does.
    m2po_mask = None
    if c.m2_threshold is not None:
        m2po_mask = input_data.get("m2po_mask")
        if m2po_mask is None:
            m2po_mask = _apply_m2po_masking(behave, prox, loss_mask, c.m2_threshold)
            stats.update(m2po_stats((behave - prox).pow(2), loss_mask, m2po_mask, c.m2_threshold))

    if c.use_sapo_loss:
        loss, loss_stats = sapo_loss_fn(
            logprobs=logprobs,
            old_logprobs=prox,
            advantages=input_data["advantages"],
            tau_pos=c.sapo_tau_pos,
            tau_neg=c.sapo_tau_neg,
            loss_mask=loss_mask,
            m2po_mask=m2po_mask,
            loss_agg_mode=c.loss_agg_mode,
            max_tokens_norm=max_new_tokens,
        )
    else:
        loss, loss_stats = ppo_actor_loss_fn(
            logprobs=logprobs,
            proximal_logprobs=prox,
            # plain PPO takes the ratio against the proximal policy; the decoupled loss also
            # weights each token by pi_prox / pi_behave
            old_logprobs=behave if c.use_decoupled_loss else prox,
            advantages=input_data["advantages"],
            eps_clip=c.eps_clip,
            loss_mask=loss_mask,
            eps_clip_higher=c.eps_clip_higher,
            c_clip=c.c_clip,
            rejection_sampling=c.rejection_sampling if c.use_decoupled_loss else None,
            importance_sampling_level=c.importance_sampling_level,
            m2po_mask=m2po_mask,
            loss_agg_mode=c.loss_agg_mode,
            max_tokens_norm=max_new_tokens,
        )
    stats.update(loss_stats)

    if behave_k2_coef:
        # our own term: same numerator (kept tokens) and denominator (valid tokens) as the loss
        keep = loss_mask if m2po_mask is None else loss_mask & m2po_mask
        k2 = 0.5 * (logprobs - behave.detach()).pow(2)
        penalty = torch.where(keep, k2, 0.0).sum() / loss_mask.sum().clamp(min=1)
        loss = loss + behave_k2_coef * penalty
        stats["custom/behave_k2"] = penalty.detach()

    n_valid = loss_mask.sum().clamp(min=1)
    stats["actor/entropy"] = (entropy * loss_mask).sum().detach() / n_valid
    return loss, stats


class CustomLossActor(PPOActor):
    """A :class:`PPOActor` whose micro-batch loss is :func:`m2po_loss_fn`.

    Everything else (proximal log-probs, advantages, minibatches, the global M2PO mask, the
    token-count denominator over all ranks, diagnostics) is inherited.
    """

    def __init__(self, *args: Any, behave_k2_coef: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.behave_k2_coef = behave_k2_coef

    def _loss_fn(
        self, logp: torch.Tensor, entropy: torch.Tensor, mb: Batch, step_in_update: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return m2po_loss_fn(
            logp,
            entropy,
            mb,
            config=self.config,
            max_new_tokens=self.max_new_tokens,
            proximal_logprobs=self._proximal(mb, logp, step_in_update),
            behave_k2_coef=self.behave_k2_coef,
        )


def random_micro_batch(seed: int = 0, b: int = 4, t: int = 12) -> Batch:
    """A synthetic micro-batch with the keys the actor loss reads (stale behaviour log-probs)."""
    gen = torch.Generator().manual_seed(seed)
    loss_mask = torch.zeros(b, t, dtype=torch.bool)
    for row in range(b):
        loss_mask[row, 3 : 3 + int(torch.randint(4, t - 3, (1,), generator=gen))] = True
    behave = -3.0 * torch.rand(b, t, generator=gen)
    prox = behave + 0.3 * torch.randn(b, t, generator=gen)
    adv = torch.randn(b, 1, generator=gen).expand(b, t).clone()
    mb = {
        "loss_mask": loss_mask,
        "logprobs": torch.where(loss_mask, behave, 0.0),
        "prox_logp": torch.where(loss_mask, prox, 0.0),
        "advantages": torch.where(loss_mask, adv, 0.0),
    }
    return mb


def compare_with_library(config: ActorConfig, seed: int = 0) -> dict[str, float]:
    """Loss and gradient of :func:`m2po_loss_fn` (``behave_k2_coef=0``) vs ``PPOActor._loss_fn``."""
    mb = random_micro_batch(seed)
    gen = torch.Generator().manual_seed(seed + 1)
    current = mb["prox_logp"] + 0.1 * torch.randn(mb["prox_logp"].shape, generator=gen)
    entropy = torch.rand(current.shape, generator=gen)
    library = PPOActor(config, engine=None, group_size=4, max_new_tokens=12)  # type: ignore[arg-type]
    lp_lib = current.clone().requires_grad_(True)
    loss_lib, _ = library._loss_fn(lp_lib, entropy, mb, 0)
    loss_lib.backward()
    lp_own = current.clone().requires_grad_(True)
    loss_own, _ = m2po_loss_fn(lp_own, entropy, mb, config=config, max_new_tokens=12)
    loss_own.backward()
    assert lp_lib.grad is not None and lp_own.grad is not None
    return {
        "library_loss": float(loss_lib.detach()),
        "custom_loss": float(loss_own.detach()),
        "max_abs_grad_diff": float((lp_lib.grad - lp_own.grad).abs().max()),
    }


def tiny_or_demo_config(tiny: bool, steps: int, output_dir: str) -> PPOConfig:
    actor = ActorConfig(
        m2_threshold=0.04,
        path="builtin:tiny" if tiny else "builtin:smollm2-135m-instruct",
        optimizer=OptimizerConfig(lr=3e-3 if tiny else 1e-5),
    )
    if not tiny:
        return PPOConfig(
            actor=actor,
            total_train_steps=steps,
            output_dir=output_dir,
            rollout=RolloutConfig(staleness=1),
        )
    return PPOConfig(
        actor=actor,
        total_train_steps=steps,
        output_dir=output_dir,
        rollout=RolloutConfig(staleness=1),
        reward=RewardConfig(path="my_reward:closeness_reward"),  # examples/my_reward.py
        gconfig=GenerationConfig(n_samples=4, max_new_tokens=8),
        train_dataset=DatasetConfig(batch_size=4),
        valid_dataset=DatasetConfig(split="test", batch_size=8, max_samples=8, shuffle=False),
        evaluator=EvaluatorConfig(freq_steps=None, eval_at_start=False, eval_at_end=False),
        saver=SaverConfig(save_at_end=False),
    )


def train_with_custom_loss(cfg: PPOConfig, behave_k2_coef: float) -> list[dict[str, Any]]:
    """Build the trainer, swap in :class:`CustomLossActor`, train; returns the logged metrics."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    trainer = RLTrainer(cfg)
    trainer.actor = CustomLossActor(
        cfg.actor,
        trainer.actor_engine,
        cfg.gconfig.n_samples,
        cfg.gconfig.max_new_tokens,
        behave_k2_coef=behave_k2_coef,
    )
    try:
        trainer.train()
    finally:
        trainer.close()
    assert cfg.output_dir is not None
    with open(os.path.join(cfg.output_dir, "metrics.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random model, seconds per step")
    parser.add_argument("--steps", type=int, default=None, help="training steps (2 tiny, 5 else)")
    parser.add_argument("--output-dir", default=None, help="run directory (default: a temp dir)")
    parser.add_argument(
        "--behave-k2-coef", type=float, default=0.1, help="weight of the extra term"
    )
    args = parser.parse_args(argv)
    if HERE not in sys.path:  # my_reward (the tiny run's reward) lives next to this file
        sys.path.insert(0, HERE)

    print("custom loss (behave_k2_coef=0) vs the library's PPOActor._loss_fn on a random batch:")
    checks = {}
    variants = {
        "clipped PPO": ActorConfig(m2_threshold=0.05, m2_scope="microbatch"),
        "SAPO": ActorConfig(m2_threshold=0.05, m2_scope="microbatch", use_sapo_loss=True),
        "decoupled PPO": ActorConfig(
            m2_threshold=0.05, m2_scope="microbatch", use_decoupled_loss=True
        ),
    }
    for name, actor_cfg in variants.items():
        checks[name] = res = compare_with_library(actor_cfg)
        print(
            f"  {name:14s} library={res['library_loss']:+.6f} custom={res['custom_loss']:+.6f} "
            f"max|grad diff|={res['max_abs_grad_diff']:.2e}"
        )

    steps = args.steps or (2 if args.tiny else 5)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="areal_m2po_custom_loss_")
    cfg = tiny_or_demo_config(args.tiny, steps, output_dir)
    records = train_with_custom_loss(cfg, args.behave_k2_coef)
    print(f"training with CustomLossActor (behave_k2_coef={args.behave_k2_coef}):")
    for r in records:
        if "actor/loss" in r:
            print(
                f"  step {r['step']}: actor/loss={r['actor/loss']:+.5f} "
                f"custom/behave_k2={r.get('custom/behave_k2', 0.0):.2e} "
                f"m2po/masked_fraction={r['m2po/masked_fraction']:.4f}"
            )
    return {"checks": checks, "config": cfg, "metrics": records}


if __name__ == "__main__":
    main()
