"""An OpenAI Agents SDK agent learns to use its tool: SmolLM2-135M-Instruct, SFT then RL, CPU.

The agent (``examples/sdk_calculator_agent.py``) is an SDK ``Agent`` with the ``calc``
``function_tool``, run by ``Runner.run`` on the Responses API against the trainer's endpoint,
on ``builtin:multiplication`` (``What is 347 * 58?``): it must call ``calc`` in the Hermes
``<tool_call>`` format and then answer with the result. Stages (each skipped when its output
is already there, so a stopped demo is rerun with the same command and goes on):

0. **Before.** Greedy episodes of the instruction-tuned model on ``--eval-problems`` held-out
   problems (the test split), run in this process through the agent workflow's evaluation:
   success (reward > 0.5) and the fraction of episodes whose replies held a parsed tool call.
1. **SFT warm-up** (``--sft-steps``, 0 to skip). ``python -m areal_m2po.train_sft`` on
   generated transcripts from the training split (the agent's instructions, the question, the
   tool call in the Hermes format, the tool's result, the number); kept short on purpose, so
   the warm model is far from perfect.
2. **RL.** ``python -m areal_m2po.train --config configs/agents_sdk_demo.yaml`` from the warm
   model (GRPO + M2PO, one step stale): every episode is a ``Runner.run`` of the SDK agent.
   The trainer's held-out evaluation runs the same greedy episodes at step 0, every
   ``--eval-every`` steps and at the end (``eval/accuracy``, ``eval/tool_use_fraction``). A
   recover checkpoint is written every step and the run resumes from it (``recover.mode=auto``).

    python examples/agents_sdk_demo.py                 # SmolLM2 (docs/agents.md for times)
    python examples/agents_sdk_demo.py --tiny          # tiny random model, seconds

Written under ``--output-dir``: ``before.json``, ``sft_data.jsonl``, ``sft/``, ``rl/``
(``metrics.jsonl``, ``config.yaml``, ``recover/``) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMOLLM2 = "builtin:smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CONFIG = REPO / "configs" / "agents_sdk_demo.yaml"


def _agent_module() -> Any:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import sdk_calculator_agent

    return sdk_calculator_agent


def tool_call_transcripts(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` SFT conversations from the training split: the agent's instructions (system),
    the question (user), the Hermes tool call of its product (assistant), the tool's result
    (tool, as the endpoint renders the SDK's function-call output) and the answer."""
    from areal_m2po.dataset.multiplication import make_multiplication_split

    agent = _agent_module()
    records = []
    for record in make_multiplication_split("train", n=n, seed=seed):
        question = agent.question_of(record)
        a, b = question[len("What is ") : -1].split(" * ")
        records.append(
            {
                "messages": [
                    {"role": "system", "content": agent.INSTRUCTIONS},
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": agent.tool_call_text(f"{a}*{b}")},
                    {"role": "tool", "content": record["answer"]},
                    {"role": "assistant", "content": record["answer"]},
                ]
            }
        )
    return records


async def _evaluate(workflow: Any, engine: Any, records: list[dict[str, Any]], batch: int) -> Any:
    rows = []
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        rows += await asyncio.gather(*(workflow.aevaluate(engine, dict(r)) for r in chunk))
    return rows


def evaluate_agent(policy: str, n: int, batch: int, max_new_tokens: int) -> dict[str, Any]:
    """Greedy SDK-agent episodes of ``policy`` on the first ``n`` test problems: success
    (with its binomial standard error), tool use, calls per episode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.api.config.agent import AgentConfig
    from areal_m2po.api.engine_api import SamplingParams
    from areal_m2po.api.workflow_api import WorkflowContext
    from areal_m2po.dataset.multiplication import make_multiplication_split
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.rollout.engines.hf import HFInProcessEngine
    from areal_m2po.rollout.workflows.agent.workflow import AgentWorkflow

    path = resolve_model_path(policy)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = HFInProcessEngine(model, tokenizer, torch.device("cpu"))
    g = GenerationConfig(n_samples=1, max_new_tokens=max_new_tokens)
    context = WorkflowContext(
        tokenizer,
        g,
        SamplingParams.from_gconfig(g),
        list(engine.eos_ids),
        None,
        max_episode_tokens=min(1024, model.config.max_position_embeddings),
        agent_config=AgentConfig(tool_call_parser="hermes"),
    )
    workflow = AgentWorkflow(context, agent=_agent_module().SdkCalculatorAgent)
    t0 = time.perf_counter()
    try:
        rows = asyncio.run(
            _evaluate(workflow, engine, make_multiplication_split("test", n=n), batch)
        )
    finally:
        workflow.close()
    success = sum(r["correct"] for r in rows) / n
    return {
        "model": policy,
        "n": n,
        "success": success,
        "success_se": math.sqrt(success * (1 - success) / n),
        "tool_use": sum(r["tool_use_fraction"] for r in rows) / n,
        "calls": sum(r["calls_mean"] for r in rows) / n,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def run(cmd: list[str]) -> None:
    """A stage in a child process, the agent module importable (its memory is freed after)."""
    path = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH")) if p)
    status = subprocess.run(
        [sys.executable, *cmd], env=dict(os.environ, PYTHONPATH=path), check=False
    ).returncode
    if status != 0:
        raise SystemExit(f"{' '.join(cmd[:2])} failed with status {status}")


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    from areal_m2po.plot import read_metrics as read_jsonl

    return read_jsonl(os.path.join(run_dir, "metrics.jsonl"))


def run_sft(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    run_dir = os.path.join(out_dir, "sft")
    final = os.path.join(run_dir, "checkpoints", "final")
    if not os.path.isdir(final):
        data = os.path.join(out_dir, "sft_data.jsonl")
        with open(data, "w", encoding="utf-8") as fh:
            for record in tool_call_transcripts(args.sft_steps * args.sft_batch, args.seed):
                fh.write(json.dumps(record) + "\n")
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
                "overwrite_output_dir=true",
                "num_threads=1",
                "stats_logger.progress_bar=false",
                *args.sft,
            ]
        )
    losses = [m["sft/loss"] for m in read_metrics(run_dir) if "sft/loss" in m]
    return {
        "path": final,
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
            str(CONFIG),
            f"actor.path={policy}",
            f"total_train_steps={args.rl_steps}",
            f"gconfig.max_new_tokens={args.max_new_tokens}",
            f"evaluator.freq_steps={args.eval_every}",
            f"valid_dataset.max_samples={args.eval_problems}",
            f"valid_dataset.batch_size={args.eval_batch}",
            f"output_dir={run_dir}",
            "recover.mode=auto",
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
            "calls": m["eval/calls_mean"],
            "n": m["eval/n"],
        }
        for m in metrics
        if "eval/accuracy" in m
    ]
    train = [
        {
            "step": m["step"],
            "reward": m.get("reward/mean", m.get("rollout/reward_mean")),
            "tool_use": m["agent/tool_episodes"] / m["agent/episodes"],
            "step_s": m["timing/step_s"],
        }
        for m in metrics
        if "agent/episodes" in m
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
    "rollout.max_episode_tokens=500",  # the tiny model's 512 positions
    "valid_dataset.batch_size=4",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny random model, seconds per stage")
    p.add_argument("--output-dir", default=None, help="default: outputs/agents-sdk-demo")
    p.add_argument("--policy", default=SMOLLM2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sft-steps", type=int, default=3, help="SFT steps (0: RL from scratch)")
    p.add_argument("--sft-batch", type=int, default=8, help="transcripts per SFT step")
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--rl-steps", type=int, default=6)
    p.add_argument("--eval-every", type=int, default=6, help="held-out eval every N RL steps")
    p.add_argument("--eval-problems", type=int, default=64, help="held-out problems")
    p.add_argument("--eval-batch", type=int, default=32, help="held-out episodes at once")
    p.add_argument("--max-new-tokens", type=int, default=40, help="per model call")
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
        f"(n={e['n']:.0f}), tool called in {100 * e['tool_use']:.1f}%, "
        f"{e['calls']:.2f} calls per episode"
    )


def _before(args: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    out = os.path.join(out_dir, "before.json")
    if not os.path.isfile(out):
        result = evaluate_agent(
            args.policy, args.eval_problems, args.eval_batch, args.max_new_tokens
        )
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(result, fh)
    with open(out, encoding="utf-8") as fh:
        return json.load(fh)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out_dir = args.output_dir or (
        tempfile.mkdtemp(prefix="agents-sdk-demo-") if args.tiny else "outputs/agents-sdk-demo"
    )
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    before = None
    if not args.skip_before:
        before = _before(args, out_dir)
        print(_eval_line(f"[0/2] before ({args.policy})", before), flush=True)
    policy, sft = args.policy, None
    if args.sft_steps > 0:
        sft = run_sft(args, out_dir)
        policy = sft["path"]
        print(
            f"[1/2] SFT: {sft['steps']} steps on {sft['examples']} transcripts, loss "
            f"{sft['loss_first']:.3f} -> {sft['loss_last']:.3f} ({sft['seconds']:.0f} s)",
            flush=True,
        )
    rl = run_rl(args, out_dir, policy)
    first, last = rl["evals"][0], rl["evals"][-1]
    print(_eval_line(f"[2/2] RL step {first['step']}", first), flush=True)
    print(_eval_line(f"      RL step {last['step']}", last), flush=True)
    print(f"RL: {len(rl['train'])} steps ({rl['seconds']:.0f} s)")
    summary = {"args": vars(args), "before": before, "sft": sft, "rl": rl}
    summary["seconds"] = time.perf_counter() - t0
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(f"summary: {os.path.join(out_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
