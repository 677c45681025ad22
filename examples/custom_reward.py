"""Train with a custom reward function given by dotted path in YAML.

``examples/custom_reward.yaml`` sets ``reward.path: my_reward:closeness_reward``, a function in
``examples/my_reward.py``. This script runs that config through the normal entry point
(``areal_m2po.train.main``, the same code as ``python -m areal_m2po.train``), then prints the
reward the trainer logged at each step.

    python examples/custom_reward.py                 # the SmolLM2 demo, 20 steps (about 5 min)
    python examples/custom_reward.py --tiny          # tiny random model, 2 steps, seconds
    python examples/custom_reward.py --tiny gconfig.n_samples=8   # extra KEY=VALUE overrides

The equivalent command line, from the repository root::

    PYTHONPATH=examples python -m areal_m2po.train --config examples/custom_reward.yaml

``PYTHONPATH`` is what makes ``my_reward`` importable there; this script does not need it
because Python puts a script's own directory first on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "custom_reward.yaml")

# --tiny: the tiny random model and small batches (the reward function stays the same).
TINY_OVERRIDES = [
    "actor.path=builtin:tiny",
    "actor.optimizer.lr=1e-4",
    "gconfig.n_samples=4",
    "gconfig.max_new_tokens=8",
    "train_dataset.batch_size=4",
    "valid_dataset.max_samples=8",
    "valid_dataset.batch_size=8",
    "evaluator.freq_steps=null",
    "evaluator.eval_at_start=false",
    "evaluator.eval_at_end=false",
    "saver.save_at_end=false",
]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny random model, seconds per step")
    parser.add_argument("--steps", type=int, default=None, help="training steps (2 with --tiny)")
    parser.add_argument("--output-dir", default=None, help="run directory (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE overrides, applied last")
    args = parser.parse_args(argv)

    if HERE not in sys.path:  # in-process use (e.g. runpy); a script run already has it
        sys.path.insert(0, HERE)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="areal_m2po_custom_reward_")
    train_argv = ["--config", CONFIG, f"output_dir={output_dir}"]
    if args.tiny:
        train_argv += TINY_OVERRIDES + ["total_train_steps=2"]
    if args.steps is not None:
        train_argv.append(f"total_train_steps={args.steps}")
    train_argv += args.overrides

    from areal_m2po.train import main as train_main

    status = train_main(train_argv)
    records: list[dict[str, Any]] = []
    metrics = os.path.join(output_dir, "metrics.jsonl")
    if status == 0 and os.path.exists(metrics):
        with open(metrics, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
        print("reward logged per step (from my_reward:closeness_reward):")
        for r in records:
            if "reward/mean" in r:
                print(
                    f"  step {r['step']}: reward/mean={r['reward/mean']:.4f} "
                    f"reward/std={r['reward/std']:.4f} reward/n_errors={r['reward/n_errors']:.0f}"
                )
    return {"status": status, "output_dir": output_dir, "metrics": records}


if __name__ == "__main__":
    sys.exit(main()["status"])
