"""Plug your own actor loss into training: truncated-IS REINFORCE on the tokens M2PO keeps.

The actor prepares every micro-batch before its loss runs (proximal log-probs, the M2PO mask,
advantages), so a custom loss is a plain function of tensors, named in the config::

    actor:
      loss_fn: custom_loss:truncated_reinforce_loss   # "module:function", importable

or passed as ``RLTrainer(cfg, actor_loss_fn=truncated_reinforce_loss)``. Its contract (argument
shapes, keys, units) is ``ActorLossFn`` in ``areal_m2po/trainer/ppo/loss_fn.py``: the batch keys
are ``behave_logp`` (behaviour log-probs, recorded at sampling), ``prox_logp`` (proximal, the
policy at step start), ``advantages``, ``loss_mask`` and, with M2PO on, ``m2po_mask``.

``truncated_reinforce_loss`` has no clipping: each kept token contributes
``-min(pi/pi_prox, TRUNCATION) * A * log pi``, averaged over the valid tokens (``token-mean``),
so its gradient is the truncated importance-weighted policy gradient.

    python examples/custom_loss.py --tiny     # tiny random model, 2 steps, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from areal_m2po.api.callbacks import StepCallback
from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.trainer.ppo.loss_fn import LossContext

HERE = os.path.dirname(os.path.abspath(__file__))
TRUNCATION = 2.0
"""Upper bound on the importance weight pi / pi_prox of a token."""


def truncated_reinforce_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    batch: dict[str, torch.Tensor],
    ctx: LossContext,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE with a truncated importance weight over the tokens M2PO kept (``ActorLossFn``).

    ``loss = -sum_kept(min(exp(logp - prox), TRUNCATION) * A * logp) / n_valid``, the weight
    detached; kept = ``loss_mask & m2po_mask``, ``n_valid`` = ``loss_mask`` tokens.
    """
    if ctx.config.loss_agg_mode != "token-mean":
        raise ValueError(
            f"truncated_reinforce_loss averages over tokens, not {ctx.config.loss_agg_mode}"
        )
    loss_mask = batch["loss_mask"]
    keep = loss_mask & batch.get("m2po_mask", loss_mask)
    weight = torch.exp(logp.detach() - batch["prox_logp"]).clamp(max=TRUNCATION)
    per_token = -weight * batch["advantages"] * logp
    n_valid = loss_mask.sum().clamp(min=1)
    loss = torch.where(keep, per_token, 0.0).sum() / n_valid
    stats = {
        "reinforce/kept_fraction": keep.sum() / n_valid,
        "reinforce/truncated_fraction": ((weight >= TRUNCATION) & keep).sum() / n_valid,
    }
    return loss, stats


class PhaseLog(StepCallback):
    """A step callback that records ``(step, phase)`` in the order the trainer reports them."""

    def __init__(self) -> None:
        self.events: list[tuple[int, str]] = []
        self.step = 0

    def on_step_begin(self, step: int) -> None:
        self.step = step

    def on_phase_end(self, name: str, seconds: float) -> None:
        self.events.append((self.step, name))


def tiny_or_demo_config(tiny: bool, steps: int, output_dir: str) -> PPOConfig:
    """A run whose actor trains with ``truncated_reinforce_loss`` (by its dotted path), built
    from the same ``KEY=VALUE`` overrides the command line takes."""
    overrides = [
        "actor.loss_fn=custom_loss:truncated_reinforce_loss",  # this file, found on sys.path
        "rollout.staleness=1",
        f"total_train_steps={steps}",
        f"output_dir={output_dir}",
    ]
    if not tiny:
        model = ["actor.path=builtin:smollm2-135m-instruct", "actor.optimizer.lr=1e-5"]
        return load_config([*overrides, *model, "actor.m2_threshold=0.04"])
    return load_config(
        [
            *overrides,
            *("actor.path=builtin:tiny", "actor.optimizer.lr=3e-3", "actor.m2_threshold=1e-4"),
            "reward.path=my_reward:closeness_reward",  # examples/my_reward.py
            *("gconfig.n_samples=4", "gconfig.max_new_tokens=8", "train_dataset.batch_size=4"),
            *("valid_dataset.split=test", "valid_dataset.batch_size=8"),
            *("valid_dataset.max_samples=8", "valid_dataset.shuffle=false"),
            *("evaluator.freq_steps=null", "evaluator.eval_at_start=false"),
            *("evaluator.eval_at_end=false", "saver.save_at_end=false"),
        ]
    )


def train(cfg: PPOConfig, callbacks: Sequence[StepCallback] = ()) -> list[dict[str, Any]]:
    """Train ``cfg`` (its ``actor.loss_fn`` is the loss); returns the logged metrics."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    trainer = RLTrainer(cfg, callbacks=callbacks)
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
    args = parser.parse_args(argv)
    if HERE not in sys.path:  # custom_loss and my_reward are imported from this folder
        sys.path.insert(0, HERE)
    steps = args.steps or (2 if args.tiny else 5)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="areal_m2po_custom_loss_")
    cfg = tiny_or_demo_config(args.tiny, steps, output_dir)
    phases = PhaseLog()
    records = train(cfg, [phases])
    print(f"training with actor.loss_fn={cfg.actor.loss_fn}:")
    for r in (r for r in records if "actor/loss" in r):
        print(
            f"  step {r['step']}: actor/loss={r['actor/loss']:+.5f} "
            f"m2po/masked_fraction={r['m2po/masked_fraction']:.4f} "
            f"reinforce/kept_fraction={r['reinforce/kept_fraction']:.4f}"
        )
    return {"config": cfg, "metrics": records, "phases": phases.events}


if __name__ == "__main__":
    main()
