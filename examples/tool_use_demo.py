"""Tool use from a cold start: SmolLM2-135M-Instruct learns to call a calculator, SFT then RL.

The task is ``builtin:multiplication`` (``What is 347 * 58? You have a calculator: ...``) with
the multi-turn workflow's calculator environment: a turn with ``<calc>347*58</calc>`` is
answered ``<result>20126</result>``, a turn without one is the answer. A 135M model cannot
multiply such numbers in its head, and from scratch it almost never calls the tool (1 call in
128 sampled episodes), so RL alone has nothing to reinforce. The demo therefore follows the
cold-start recipe of agentic RL:

0. **Before.** Greedy episodes of the instruction-tuned model on ``--eval-problems`` held-out
   problems (``scripts/eval_multi_turn.py``): success rate, episodes that called the tool.
1. **SFT warm-up.** ``python -m areal_m2po.train_sft`` for ``--sft-steps`` steps on generated
   demonstrations (question, ``<calc>a*b</calc>``, the tool's result, the number) from the
   training split; kept short on purpose, so the warm model is far from perfect.
2. **RL.** ``python -m areal_m2po.train --config configs/tool_use.yaml`` from the SFT model
   (GRPO + M2PO, one step stale, multi-turn calculator episodes). The trainer's own held-out
   evaluation runs greedy episodes on the same problems at step 0 (the SFT model), every
   ``--eval-every`` steps and at the end: ``eval/accuracy`` (episode success) with
   ``eval/accuracy_se``, ``eval/tool_use_fraction``, ``eval/second_turn_fraction``.

    python examples/tool_use_demo.py                        # SmolLM2 (docs/agents.md for times)
    python examples/tool_use_demo.py --tiny                 # tiny random model, seconds

Everything is written under ``--output-dir``: ``before.json``, ``sft_data.jsonl``, ``sft/``
(the SFT run; ``sft/checkpoints/final`` is the warm model), ``rl/`` (the RL run:
``metrics.jsonl``, ``config.yaml``) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMOLLM2 = "builtin:smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[1]
_QUESTION = re.compile(r"What is (\d+) \* (\d+)\?")


def tool_demonstrations(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` conversations from the training split: the question, the tool call, its result (as
    the calculator environment renders it) and the answer."""
    from areal_m2po.dataset.multiplication import make_multiplication_split
    from areal_m2po.rollout.workflows.multi_turn.calculator import calculate

    records = []
    for record in make_multiplication_split("train", n=n, seed=seed):
        match = _QUESTION.match(record["question"])
        assert match is not None, record["question"]
        expression = f"{match.group(1)}*{match.group(2)}"
        result = calculate(expression)
        assert result == record["answer"]
        records.append(
            {
                "messages": [
                    {"role": "user", "content": record["question"]},
                    {"role": "assistant", "content": f"<calc>{expression}</calc>"},
                    {"role": "user", "content": f"<result>{result}</result>"},
                    {"role": "assistant", "content": result},
                ]
            }
        )
    return records


def run(cmd: list[str]) -> None:
    """A stage in a child process (its memory goes back to the system when it ends)."""
    status = subprocess.run([sys.executable, *cmd], check=False).returncode
    if status != 0:
        raise SystemExit(f"{' '.join(cmd[:2])} failed with status {status}")


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of ``run_dir``'s metrics.jsonl."""
    from areal_m2po.plot import read_metrics as read_jsonl

    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


def evaluate_before(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    out = os.path.join(out_dir, "before.json")
    run(
        [
            str(REPO / "scripts" / "eval_multi_turn.py"),
            f"--model={args.policy}",
            f"--n={args.eval_problems}",
            f"--max-new-tokens={args.max_new_tokens}",
            f"--max-turns={args.max_turns}",
            f"--batch-size={args.eval_batch}",
            f"--out={out}",
        ]
    )
    with open(out, encoding="utf-8") as fh:
        return json.load(fh)


def run_sft(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    data = os.path.join(out_dir, "sft_data.jsonl")
    with open(data, "w", encoding="utf-8") as fh:
        for record in tool_demonstrations(args.sft_steps * args.sft_batch, args.seed):
            fh.write(json.dumps(record) + "\n")
    run_dir = os.path.join(out_dir, "sft")
    run(
        [
            "-m",
            "areal_m2po.train_sft",
            f"model.path={args.policy}",
            f"train_dataset.path={data}",
            f"train_dataset.batch_size={args.sft_batch}",
            "valid_dataset=null",
            f"total_train_steps={args.sft_steps}",
            f"model.optimizer.lr={args.sft_lr}",
            f"output_dir={run_dir}",
            "num_threads=1",
            "stats_logger.progress_bar=false",
            *args.sft,
        ]
    )
    losses = [m["sft/loss"] for m in read_metrics(run_dir) if "sft/loss" in m]
    return {
        "path": os.path.join(run_dir, "checkpoints", "final"),
        "steps": len(losses),
        "examples": args.sft_steps * args.sft_batch,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "seconds": time.perf_counter() - t0,
    }


def run_rl(args: argparse.Namespace, out_dir: str, policy: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    run_dir = os.path.join(out_dir, "rl")
    run(
        [
            "-m",
            "areal_m2po.train",
            "--config",
            str(REPO / "configs" / "tool_use.yaml"),
            f"actor.path={policy}",
            f"total_train_steps={args.rl_steps}",
            f"gconfig.max_new_tokens={args.max_new_tokens}",
            "rollout.workflow_kwargs={environment: calculator, max_turns: "
            f"{args.max_turns}, turn_discount: 1.0}}",
            f"evaluator.freq_steps={args.eval_every}",
            f"valid_dataset.max_samples={args.eval_problems}",
            f"valid_dataset.batch_size={args.eval_batch}",
            f"output_dir={run_dir}",
            *args.rl,
        ]
    )
    metrics = read_metrics(run_dir)
    evals = [
        {
            "step": m["step"],
            "success": m["eval/accuracy"],
            "success_se": m["eval/accuracy_se"],
            "tool_use": m["eval/tool_use_fraction"],
            "second_turn": m["eval/second_turn_fraction"],
            "turns": m["eval/turns_mean"],
            "n": m["eval/n"],
        }
        for m in metrics
        if "eval/accuracy" in m
    ]
    train = [
        {
            "step": m["step"],
            "solved": m["multi_turn/solved_episodes"] / m["multi_turn/episodes"],
            "tool_use": m["multi_turn/tool_episodes"] / m["multi_turn/episodes"],
            "step_s": m["timing/step_s"],
        }
        for m in metrics
        if "multi_turn/episodes" in m
    ]
    return {"evals": evals, "train": train, "seconds": time.perf_counter() - t0}


TINY = {
    "policy": "builtin:tiny",
    "sft_steps": 2,
    "sft_batch": 4,
    "sft_lr": 1e-3,
    "rl_steps": 2,
    "eval_every": 1,
    "eval_problems": 4,
    "eval_batch": 4,
    "max_new_tokens": 6,
}
TINY_RL = [
    "actor.optimizer.lr=1e-4",
    "gconfig.n_samples=2",
    "train_dataset.batch_size=2",
    "train_dataset.max_prompt_length=506",  # + 6 new tokens: the tiny model's 512 positions
    "valid_dataset.max_prompt_length=506",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny random model, seconds per stage")
    p.add_argument("--output-dir", default=None, help="default: outputs/tool-use-demo")
    p.add_argument("--policy", default=SMOLLM2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sft-steps", type=int, default=2, help="SFT steps (0: RL from scratch)")
    p.add_argument("--sft-batch", type=int, default=8, help="demonstrations per SFT step")
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--rl-steps", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=5, help="held-out eval every N RL steps")
    p.add_argument("--eval-problems", type=int, default=256, help="held-out problems")
    p.add_argument("--eval-batch", type=int, default=64, help="held-out episodes at once")
    p.add_argument("--max-new-tokens", type=int, default=32, help="per policy turn")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--skip-before", action="store_true", help="no stage 0")
    p.add_argument("--sft", nargs="*", default=[], help="extra train_sft KEY=VALUE overrides")
    p.add_argument("--rl", nargs="*", default=[], help="extra RL KEY=VALUE overrides")
    args = p.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
        args.rl = [*TINY_RL, *args.rl]
    return args


def _eval_line(label: str, e: dict[str, Any]) -> str:
    return (
        f"{label}: success {100 * e['success']:.1f}% +- {100 * e['success_se']:.1f} "
        f"(n={e['n']:.0f}), tool used in {100 * e['tool_use']:.1f}%, second turn in "
        f"{100 * e['second_turn']:.1f}%"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out_dir = args.output_dir or (
        tempfile.mkdtemp(prefix="tool-use-demo-") if args.tiny else "outputs/tool-use-demo"
    )
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    before = None
    if not args.skip_before:
        before = evaluate_before(args, out_dir)
        row = {
            "success": before["solved"],
            "success_se": before["solved_se"],
            "tool_use": before["used_tool"],
            "second_turn": before["second_turn"],
            "n": before["n"],
        }
        print(_eval_line(f"[0/2] before ({args.policy})", row), flush=True)
    policy, sft = args.policy, None
    if args.sft_steps > 0:
        sft = run_sft(args, out_dir)
        policy = sft["path"]
        print(
            f"[1/2] SFT: {sft['steps']} steps on {sft['examples']} demonstrations, loss "
            f"{sft['loss_first']:.3f} -> {sft['loss_last']:.3f} ({sft['seconds']:.0f} s)",
            flush=True,
        )
    rl = run_rl(args, out_dir, policy)
    first, last = rl["evals"][0], rl["evals"][-1]
    print(_eval_line(f"[2/2] RL step {first['step']}", first), flush=True)
    print(_eval_line(f"      RL step {last['step']}", last), flush=True)
    print(f"RL: {len(rl['train'])} steps ({rl['seconds']:.0f} s)")
    summary = {
        "args": vars(args),
        "before": before,
        "sft": sft,
        "rl": rl,
        "seconds": time.perf_counter() - t0,
    }
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(f"summary: {os.path.join(out_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
