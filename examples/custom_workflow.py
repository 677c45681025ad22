"""Your own rollout workflow: a format bonus on top of the config's rewards, and a group filter.

A workflow turns one dataset record into a scored group of trajectories (or ``None`` to drop
it); the trainer runs the same workflow in sync and async mode. This one reuses the built-in
single-turn workflow (sample ``n``, decode, score with ``reward.path`` and ``reward.model``)
and changes two hooks:

* ``score``: every completion containing a digit gets ``format_bonus`` more reward;
* ``accept``: a group whose completions are all the same text is dropped (no GRPO signal).

Name it in the config, with its keyword arguments::

    rollout:
      workflow: custom_workflow:FormatBonusWorkflow   # "module:Name", importable
      workflow_kwargs: {format_bonus: 0.5}

    python examples/custom_workflow.py --tiny     # tiny random model, 2 steps, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from areal_m2po.api.config_loader import load_config
from areal_m2po.api.engine_api import ModelResponse
from areal_m2po.api.workflow_api import TrajectoryGroup, WorkflowContext
from areal_m2po.rollout.rewards import GroupScores
from areal_m2po.rollout.workflows.rlvr import RLVRWorkflow

HERE = os.path.dirname(os.path.abspath(__file__))


class FormatBonusWorkflow(RLVRWorkflow):
    """RLVR plus ``format_bonus`` for each completion with a digit; identical groups dropped."""

    def __init__(self, context: WorkflowContext, format_bonus: float = 0.1) -> None:
        super().__init__(context)
        self.format_bonus = float(format_bonus)

    async def score(
        self, record: dict[str, Any], responses: Sequence[ModelResponse], texts: Sequence[str]
    ) -> GroupScores:
        scores = await super().score(record, responses, texts)  # every configured source
        bonus = [self.format_bonus if any(ch.isdigit() for ch in t) else 0.0 for t in texts]
        scores.rewards = [r + b for r, b in zip(scores.rewards, bonus)]
        for info, b in zip(scores.info, bonus):
            info["format_bonus"] = b
        scores.stats["workflow/format_hits"] = float(sum(b > 0 for b in bonus))
        return scores

    def accept(self, group: TrajectoryGroup, texts: Sequence[str]) -> bool:
        return len(set(texts)) > 1

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        stats = super().finish_batch(groups)
        if self.context.reward.learned is not None:  # it rewrote the rewards: add the bonus
            for t in (t for g in groups for t in g.trajectories):
                t.reward += t.info["format_bonus"]
        return stats


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random model, seconds per step")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--bonus", type=float, default=0.5)
    parser.add_argument("--output-dir", default=None, help="run directory (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="more KEY=VALUE config overrides")
    args = parser.parse_args(argv)
    if HERE not in sys.path:  # custom_workflow and my_reward are imported from this folder
        sys.path.insert(0, HERE)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="areal_m2po_custom_workflow_")
    config = [os.path.join(HERE, "..", "configs", "tiny.yaml")] if args.tiny else []
    cfg = load_config(
        [
            *(["--config", *config] if config else []),
            "rollout.workflow=custom_workflow:FormatBonusWorkflow",
            f"rollout.workflow_kwargs={{format_bonus: {args.bonus}}}",
            "reward.path=my_reward:closeness_reward",  # examples/my_reward.py
            f"total_train_steps={args.steps}",
            f"output_dir={output_dir}",
            "saver.save_at_end=false",
            *args.overrides,
        ]
    )
    from areal_m2po.trainer.rl_trainer import RLTrainer

    trainer = RLTrainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    for r in (r for r in records if "reward/mean" in r):
        print(
            f"step {r['step']}: reward/mean={r['reward/mean']:.4f} "
            f"workflow/format_hits={r['workflow/format_hits']:.0f} "
            f"rollout/n_dropped_groups={r['rollout/n_dropped_groups']:.0f}"
        )
    return {"config": cfg, "metrics": records}


if __name__ == "__main__":
    main()
