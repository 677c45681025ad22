"""Greedy multi-turn evaluation of a model on a built-in task: success, tool use, second turns.

The trainer's own evaluation is single-turn; this runs whole episodes of the multi-turn
workflow (``areal_m2po.rollout.workflows.multi_turn.evaluation``) and prints one JSON line::

    python scripts/eval_multi_turn.py --model builtin:smollm2-135m-instruct
    python scripts/eval_multi_turn.py --model outputs/tool-use/trial0/checkpoints/final

(``--environment retry --dataset builtin:arithmetic`` for the retry turn). Fix the threads
with ``--threads``; nothing here is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import torch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model folder or builtin:NAME")
    p.add_argument("--dataset", default="builtin:multiplication")
    p.add_argument("--split", default="test")
    p.add_argument("--n", type=int, default=256, help="held-out problems")
    p.add_argument("--environment", default="calculator", choices=("calculator", "retry"))
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=32, help="per turn")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.api.engine_api import SamplingParams
    from areal_m2po.api.errors import ConfigError
    from areal_m2po.api.workflow_api import WorkflowContext
    from areal_m2po.dataset.loader import build_prompts, load_records
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.rollout.engines.hf import HFInProcessEngine
    from areal_m2po.rollout.workflows.multi_turn.evaluation import evaluate_multi_turn
    from areal_m2po.trainer.preflight import check_model_path
    from areal_m2po.utils.console import print_error

    try:  # a missing model: one line, not transformers' traceback
        check_model_path("--model", args.model, needs_model=True)
    except ConfigError as exc:
        print_error(exc)
        return 2
    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    records = load_records(args.dataset, split=args.split, max_samples=args.n)
    prompts, _ = build_prompts(records, tokenizer, max_prompt_length=512)
    g = GenerationConfig(n_samples=1, max_new_tokens=args.max_new_tokens)
    engine = HFInProcessEngine(model, tokenizer, torch.device("cpu"))
    context = WorkflowContext(
        tokenizer, g, SamplingParams.from_gconfig(g), list(engine.eos_ids), None
    )
    t0 = time.perf_counter()
    result = asyncio.run(
        evaluate_multi_turn(
            engine,
            context,
            prompts,
            args.batch_size,
            environment=args.environment,
            max_turns=args.max_turns,
        )
    )
    line = json.dumps(
        {"model": args.model, "dataset": args.dataset, "environment": args.environment,
         **result.as_dict(), "seconds": round(time.perf_counter() - t0, 1)}
    )  # fmt: skip
    print(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
