"""RLHF end to end on the built-in arithmetic task: SFT -> preference pairs -> reward model -> PPO.

0. **SFT.** ``python -m areal_m2po.train_sft`` fine-tunes SmolLM2-135M-Instruct on the correct
   answers of training problems (its built-in default) and reports the held-out loss before and
   after; the fine-tuned model is the policy of every later stage, the body the reward model
   starts from and the KL reference of PPO (``--sft-steps 0`` skips it and starts from the
   instruction-tuned model itself).
1. **Preference pairs from the policy's own samples.** The policy (SmolLM2-135M-Instruct)
   answers training problems: one greedy answer and ``--samples`` sampled ones per problem.
   The answer checker labels them; for a problem with a right and a wrong answer, (right,
   wrong) is a pair. **The checker stands in for a human labeller**: in real RLHF people
   compare the two answers; here the comparison is automatic so the demo runs anywhere, and
   the checker's verdict is also the *true* reward we can measure the policy with.
2. **Reward model.** ``python -m areal_m2po.train_rm`` trains a Bradley-Terry reward model
   (SmolLM2-135M-Instruct body + a scalar head) on 80% of the problems' pairs and reports its
   pair accuracy on the held-out 20%.
3. **PPO against the learned reward only.** ``python -m areal_m2po.train`` with
   ``reward.model.path`` = the reward model and ``reward.model.verifiable_weight=0``: the checker
   never enters the policy's reward. It is still run on every sample and logged
   (``reward/verifiable``), and the held-out greedy accuracy (``eval/accuracy``) is the checker's,
   so we see the *true* effect: accuracy before and after, and, step by step, the learned reward
   next to the true one (a learned reward that rises while the true one does not is reward
   over-optimisation).

4. **DPO on the same pairs** (``--dpo``): ``python -m areal_m2po.train_dpo`` trains the SFT
   policy directly on the reward model's training pairs (its budget: epochs, pairs per step;
   its learning rate, or one arm per ``--dpo-lr``), and reports its implicit-reward accuracy on
   the same held-out pairs and the *true* held-out greedy accuracy, measured as the PPO run
   measures it (docs/dpo.md).

    python examples/rlhf_reward_model.py                     # SmolLM2 (see docs/rlhf.md for times)
    python examples/rlhf_reward_model.py --tiny              # tiny random model, seconds
    python examples/rlhf_reward_model.py --ppo-steps 20 --ppo actor.kl_ctl=0.01
    python examples/rlhf_reward_model.py --dpo --dpo-lr 3e-5 1e-6 --plot comparison.png

Rerunning the same command continues a run that stopped: a finished stage is not run again
(its summary is in ``stages/<name>.json``), and the SFT, PPO and DPO stages resume from their
recover checkpoints.

``--tiny`` exercises every stage with the tiny random model, which never answers a sum right;
its pairs are labelled by the share of digits in the answer instead (a stand-in for the stand-in).
Everything is written under ``--output-dir``: ``sft/`` (the SFT run; ``sft/checkpoints/final``
is the model), ``pairs/{train,valid}.jsonl``, ``rm/`` (the reward
model run; ``rm/checkpoints/final`` is the model), ``ppo/`` (the PPO run), ``dpo*/`` and ``eval/`` (``--dpo``), ``stages/`` and
``summary.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

SMOLLM2 = "builtin:smollm2-135m-instruct"


# ---------------------------------------------------------------------------------------------
# labellers: the checker (real demo) or the share of digits (--tiny)
# ---------------------------------------------------------------------------------------------


def checker_label(prompt: str, completion: str, answer: str) -> float:
    """1.0 when the answer checker accepts the completion, else 0.0 (the stand-in labeller)."""
    from areal_m2po.reward.math_reward import math_reward_fn

    return float(math_reward_fn(prompt, completion, answer))


def digit_share_label(prompt: str, completion: str, answer: str) -> float:
    """Share of digit characters (``--tiny``: a random model never gets a sum right)."""
    return sum(ch.isdigit() for ch in completion) / len(completion) if completion else 0.0


# ---------------------------------------------------------------------------------------------
# 1. preference pairs from the policy's own samples
# ---------------------------------------------------------------------------------------------


def make_pairs(
    question: str,
    completions: list[str],
    scores: list[float],
    max_pairs: int,
    rng: random.Random,
) -> list[dict[str, str]]:
    """(better, worse) pairs among one problem's distinct completions, at most ``max_pairs``."""
    best: dict[str, float] = {}
    for text, score in zip(completions, scores):
        if text.strip():
            best[text] = max(score, best.get(text, -math.inf))
    items = sorted(best.items())
    pairs = [
        {"prompt": question, "chosen": a, "rejected": b}
        for a, sa in items
        for b, sb in items
        if sa > sb
    ]
    rng.shuffle(pairs)
    return pairs[:max_pairs]


def collect_pairs(args: argparse.Namespace, out_dir: str, label: Callable[..., float]) -> dict:
    """Sample the policy on training problems, label, and write pairs/{train,valid}.jsonl."""
    import torch
    from transformers import AutoTokenizer

    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.dataset import build_prompts, load_records
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import load_causal_lm
    from areal_m2po.rollout.engines.hf_generator import HFGenerator

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args.policy))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # seed + 1000: other problems than the PPO run's first batches (same train split)
    records = load_records("builtin:arithmetic", "train", max_samples=args.pair_prompts, seed=1000)
    prompts, _ = build_prompts(records, tokenizer, 256, use_chat_template=True)
    model = load_causal_lm(args.policy, "float32", "sdpa")
    engine = HFGenerator(model, tokenizer, torch.device("cpu"))
    sampled = GenerationConfig(
        n_samples=args.samples, max_new_tokens=args.max_new_tokens, temperature=args.temperature
    )
    rng = random.Random(0)
    by_prompt: list[list[dict[str, str]]] = []
    n_right = n_samples = 0
    for start in range(0, len(prompts), args.gen_batch):
        chunk = prompts[start : start + args.gen_batch]
        ids = [r["prompt_ids"] for r in chunk]
        greedy = engine.decode_completions(engine.generate(ids, sampled, greedy=True))
        samples = engine.decode_completions(engine.generate(ids, sampled, seed=start))
        for i, record in enumerate(chunk):
            texts = [greedy[i], *samples[i * args.samples : (i + 1) * args.samples]]
            scores = [label(record["prompt_text"], t, record["answer"]) for t in texts]
            n_right += sum(s > 0.5 for s in scores)
            n_samples += len(scores)
            by_prompt.append(
                make_pairs(record["question"], texts, scores, args.max_pairs_per_prompt, rng)
            )
        print(
            f"      sampled {min(start + args.gen_batch, len(prompts))}/{len(prompts)} problems "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    del engine, model
    gc.collect()
    # split by problem, so held-out pairs are about problems the reward model never saw
    with_pairs = [p for p in by_prompt if p]
    rng.shuffle(with_pairs)
    n_valid = max(1, round(len(with_pairs) * args.valid_fraction))
    split = {"valid": with_pairs[:n_valid], "train": with_pairs[n_valid:]}
    os.makedirs(os.path.join(out_dir, "pairs"), exist_ok=True)
    counts = {}
    for name, groups in split.items():
        rows = [pair for group in groups for pair in group]
        counts[name] = len(rows)
        with open(os.path.join(out_dir, "pairs", f"{name}.jsonl"), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return {
        "problems": len(prompts),
        "samples": n_samples,
        "labelled_right": n_right,
        "problems_with_pairs": len(with_pairs),
        "train_pairs": counts["train"],
        "valid_pairs": counts["valid"],
        "seconds": time.perf_counter() - t0,
    }


# ---------------------------------------------------------------------------------------------
# 2. the reward model, 3. PPO against it
# ---------------------------------------------------------------------------------------------


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run_stage(module: str, overrides: list[str]) -> int:
    """``python -m <module> KEY=VALUE ...`` in a child process (its output goes to ours), so
    each stage's memory is returned to the system when it ends; returns the exit status."""
    return subprocess.run([sys.executable, "-m", module, *overrides], check=False).returncode


def cached_stage(out_dir: str, name: str, fn: Callable[[], dict]) -> dict:
    """``fn()``, the summary of stage ``name``, kept in ``stages/<name>.json``; a rerun of the
    demo reads a finished stage's summary instead of running it again."""
    path = os.path.join(out_dir, "stages", f"{name}.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            print(f"      {name}: finished in an earlier run ({path})", flush=True)
            return dict(json.load(fh))
    result = fn()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    os.replace(path + ".tmp", path)
    return result


def run_sft(args: argparse.Namespace, out_dir: str) -> dict:
    """Stage 0: supervised fine-tuning of ``args.policy`` on correct answers (train_sft's
    built-in default data); the fine-tuned model becomes the policy and the reward model's
    base."""
    t0 = time.perf_counter()
    run_dir = os.path.join(out_dir, "sft")
    status = run_stage(
        "areal_m2po.train_sft",
        [
            f"model.path={args.policy}",
            f"output_dir={run_dir}",
            "overwrite_output_dir=true",  # an unfinished stage starts again
            f"total_train_steps={args.sft_steps}",
            f"model.optimizer.lr={args.sft_lr}",
            "evaluator.freq_steps=null",
            "stats_logger.progress_bar=false",
            "recover.mode=auto",
            *args.sft,
        ],
    )
    if status != 0:
        raise SystemExit(f"train_sft failed with status {status}")
    metrics = read_metrics(run_dir)
    evals = [m for m in metrics if "eval/loss" in m]
    return {
        "path": os.path.join(run_dir, "checkpoints", "final"),
        "steps": metrics[-1]["step"],
        "eval_loss_before": evals[0]["eval/loss"],
        "eval_loss": evals[-1]["eval/loss"],
        "eval_perplexity": evals[-1]["eval/perplexity"],
        "seconds": time.perf_counter() - t0,
    }


def train_reward_model(args: argparse.Namespace, out_dir: str) -> dict:
    t0 = time.perf_counter()
    pairs = os.path.join(out_dir, "pairs")
    run_dir = os.path.join(out_dir, "rm")
    status = run_stage(
        "areal_m2po.train_rm",
        [
            f"model.path={args.rm_base}",
            f"train_dataset.path={pairs}/train.jsonl",
            f"valid_dataset.path={pairs}/valid.jsonl",
            f"output_dir={run_dir}",
            "overwrite_output_dir=true",  # an unfinished stage starts again
            f"total_train_epochs={args.rm_epochs}",
            f"train_dataset.batch_size={args.rm_batch}",
            "train_dataset.drop_last=false",
            f"model.optimizer.lr={args.rm_lr}",
            "evaluator.freq_steps=null",
            "stats_logger.progress_bar=false",
            *args.rm,
        ],
    )
    if status != 0:
        raise SystemExit(f"train_rm failed with status {status}")
    metrics = read_metrics(run_dir)
    evals = [m for m in metrics if "eval/accuracy" in m]
    return {
        "path": os.path.join(run_dir, "checkpoints", "final"),
        "steps": metrics[-1]["step"],
        "eval_accuracy_before": evals[0]["eval/accuracy"],
        "eval_accuracy": evals[-1]["eval/accuracy"],
        "eval_pairs": evals[-1]["eval/n_pairs"],
        "seconds": time.perf_counter() - t0,
    }


def run_ppo(args: argparse.Namespace, out_dir: str, rm_path: str) -> dict:
    t0 = time.perf_counter()
    run_dir = os.path.join(out_dir, "ppo")
    status = run_stage(
        "areal_m2po.train",
        [
            f"actor.path={args.policy}",
            f"reward.model.path={rm_path}",
            "reward.model.verifiable_weight=0",  # the learned reward alone
            f"total_train_steps={args.ppo_steps}",
            f"evaluator.freq_steps={args.eval_every}",
            f"valid_dataset.max_samples={args.eval_problems}",
            f"valid_dataset.batch_size={args.eval_problems}",
            f"output_dir={run_dir}",
            "overwrite_output_dir=true",  # an unfinished stage starts again
            "saver.save_at_end=false",
            "stats_logger.progress_bar=false",
            "recover.mode=auto",
            "recover.freq_steps=4",
            *args.ppo,
        ],
    )
    if status != 0:
        raise SystemExit(f"PPO failed with status {status}")
    metrics = read_metrics(run_dir)
    evals = [(m["step"], m["eval/accuracy"]) for m in metrics if "eval/accuracy" in m]
    steps = [m for m in metrics if "reward/model_score" in m]
    return {
        "true_accuracy": evals,  # (step, held-out greedy accuracy by the checker)
        "per_step": [
            {
                "step": m["step"],
                "learned": m["reward/model_score"],
                "learned_std": m["reward/model_score_std"],
                "true": m["reward/verifiable"],
                "corr": m["reward/model_verifiable_corr"],
            }
            for m in steps
        ],
        "seconds": time.perf_counter() - t0,
    }


def reward_gap(per_step: list[dict[str, float]], window: int) -> dict[str, float]:
    """Learned vs true reward from the first ``window`` steps to the last ``window`` steps.

    The learned reward's change is in units of the first steps' RM-score std within a batch
    (so it is comparable across reward models); the true reward's change is in points of
    sampled accuracy. Over-optimisation shows as a learned gain with no true gain.
    """
    first, last = per_step[:window], per_step[-window:]

    def mean(rows: list[dict[str, float]], key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    scale = mean(first, "learned_std") or 1.0
    return {
        "learned_first": mean(first, "learned"),
        "learned_last": mean(last, "learned"),
        "learned_gain_in_std": (mean(last, "learned") - mean(first, "learned")) / scale,
        "true_first": mean(first, "true"),
        "true_last": mean(last, "true"),
        "true_gain_points": 100 * (mean(last, "true") - mean(first, "true")),
        "corr_first": mean(first, "corr"),
        "corr_last": mean(last, "corr"),
    }


# ---------------------------------------------------------------------------------------------
# 4. DPO on the same pairs (--dpo), measured as the PPO run is
# ---------------------------------------------------------------------------------------------


def true_accuracy(args: argparse.Namespace, out_dir: str, model_path: str, name: str) -> float:
    """The held-out greedy accuracy (checker) of ``model_path``, measured exactly as the PPO
    stage measures its policy: the step-0 ``eval/accuracy`` of ``python -m areal_m2po.train``
    with the PPO stage's evaluation settings (same problems, generation settings, checker),
    in a one-step run whose training step is not used."""
    run_dir = os.path.join(out_dir, "eval", name)
    status = run_stage(
        "areal_m2po.train",
        [
            f"actor.path={model_path}",
            "total_train_steps=1",
            "evaluator.freq_steps=null",
            "evaluator.eval_at_end=false",
            f"valid_dataset.max_samples={args.eval_problems}",
            f"valid_dataset.batch_size={args.eval_problems}",
            f"output_dir={run_dir}",
            "overwrite_output_dir=true",  # an unfinished stage starts again
            "saver.save_at_end=false",
            "stats_logger.progress_bar=false",
            *args.ppo,
        ],
    )
    if status != 0:
        raise SystemExit(f"evaluation of {model_path} failed with status {status}")
    return float(next(m["eval/accuracy"] for m in read_metrics(run_dir) if m["step"] == 0))


def dpo_arm_name(args: argparse.Namespace, lr: float) -> str:
    """``dpo`` for the reward model's learning rate, else ``dpo_lr<lr>``."""
    return "dpo" if lr == args.rm_lr else f"dpo_lr{lr:g}"


def run_dpo(args: argparse.Namespace, out_dir: str, train_pairs: int, lr: float) -> dict:
    """SFT -> DPO at learning rate ``lr`` on the reward model's pairs with the reward-model
    stage's budget (epochs, pairs per step), saving and evaluating the held-out pairs halfway
    and at the end; the run lands in ``<out_dir>/<dpo_arm_name>``."""
    t0 = time.perf_counter()
    pairs = os.path.join(out_dir, "pairs")
    run_dir = os.path.join(out_dir, dpo_arm_name(args, lr))
    steps = math.ceil(train_pairs / args.rm_batch) * args.rm_epochs
    half = max(1, steps // 2)
    status = run_stage(
        "areal_m2po.train_dpo",
        [
            f"model.path={args.policy}",
            f"train_dataset.path={pairs}/train.jsonl",
            f"valid_dataset.path={pairs}/valid.jsonl",
            f"output_dir={run_dir}",
            "overwrite_output_dir=true",  # an unfinished stage starts again
            f"total_train_epochs={args.rm_epochs}",
            f"train_dataset.batch_size={args.rm_batch}",
            "train_dataset.drop_last=false",
            f"model.optimizer.lr={lr}",
            f"beta={args.dpo_beta}",
            f"evaluator.freq_steps={half}",
            f"saver.freq_steps={half}",
            "recover.mode=auto",
            f"recover.freq_steps={half}",
            "stats_logger.progress_bar=false",
            *args.dpo_args,
        ],
    )
    if status != 0:
        raise SystemExit(f"train_dpo failed with status {status}")
    return {"half": half, "seconds": time.perf_counter() - t0}


def dpo_arm(args: argparse.Namespace, out_dir: str, train_pairs: int, lr: float) -> dict:
    """One DPO arm: trained once (a finished run is not trained again), then read from its
    metrics: the held-out pair metrics at each evaluation, the training pairs' completion
    log-probs per step (falling chosen log-probs: likelihood displacement), and the true
    held-out greedy accuracy of the SFT model, the halfway save and the final model."""
    name = dpo_arm_name(args, lr)
    run = cached_stage(out_dir, name, lambda: run_dpo(args, out_dir, train_pairs, lr))
    run_dir = os.path.join(out_dir, name)
    metrics = read_metrics(run_dir)
    evals = [m for m in metrics if "eval/accuracy" in m]
    steps = metrics[-1]["step"]
    models = [
        ("sft", 0, args.policy),
        (f"{name}_half", run["half"], os.path.join(run_dir, "checkpoints", f"step_{run['half']}")),
        (f"{name}_final", steps, os.path.join(run_dir, "checkpoints", "final")),
    ]
    true = []
    for tag, step, path in models:
        acc = cached_stage(
            out_dir,
            f"eval_{tag}",
            lambda p=path, t=tag: {"acc": true_accuracy(args, out_dir, p, t)},
        )["acc"]
        true.append([step, acc])
    keys = ("step", "eval/accuracy", "eval/margin", "eval/loss")
    return {
        "name": name,
        "lr": lr,
        "path": models[-1][2],
        "steps": steps,
        "half": run["half"],
        "held_out_pairs": [{k: m[k] for k in keys} for m in evals],
        "eval_pairs": evals[-1]["eval/n_pairs"],
        "train_logps": [
            [m["step"], m["dpo/chosen_logp"], m["dpo/rejected_logp"]]
            for m in metrics
            if "dpo/chosen_logp" in m
        ],
        "true_accuracy": true,
        "seconds": run["seconds"],
    }


def plot_comparison(summary: dict[str, Any], path: str) -> str:
    """Three panels: the true held-out greedy accuracy per training step of PPO (learned
    reward) and of each DPO arm; the held-out pair accuracy of the reward model and of each
    arm's implicit reward; each arm's chosen and rejected completion log-probs on its training
    pairs. Writes the PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ppo, arms, rm = summary["ppo"], summary["dpo"], summary["reward_model"]
    n = summary["args"]["eval_problems"]
    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(16, 4.2), constrained_layout=True)
    curves = [("SFT -> RM -> PPO", ppo["true_accuracy"])]
    curves += [(f"SFT -> DPO, lr {a['lr']:g}", a["true_accuracy"]) for a in arms]
    for label, points in curves:
        steps, acc = zip(*points)
        se = [100 * math.sqrt(a * (1 - a) / n) for a in acc]
        left.errorbar(steps, [100 * a for a in acc], yerr=se, marker="o", capsize=3, label=label)
    left.set_xlabel("training step (PPO: 4 problems x 8 samples; DPO: 16 pairs)")
    left.set_ylabel(f"true held-out greedy accuracy, % ({n} problems)")
    left.set_ylim(0, 100)
    left.legend()
    bars = {"RM\nbefore": rm["eval_accuracy_before"], "RM\nafter": rm["eval_accuracy"]}
    # DPO's implicit reward starts at 0 accuracy (pi = pi_ref: every pair a tie)
    for a in arms:
        bars[f"DPO {a['lr']:g}\nafter"] = a["held_out_pairs"][-1]["eval/accuracy"]
    colors = ["C0", "C0"] + [f"C{i + 1}" for i in range(len(arms))]  # as the curves
    mid.bar(list(bars), [100 * v for v in bars.values()], color=colors)
    mid.set_ylabel(f"held-out pair accuracy, % ({rm['eval_pairs']:.0f} pairs)")
    mid.set_ylim(0, 100)
    for i, a in enumerate(arms):
        steps, chosen, rejected = zip(*a["train_logps"])
        right.plot(steps, chosen, color=f"C{i + 1}", label=f"lr {a['lr']:g} chosen")
        right.plot(steps, rejected, color=f"C{i + 1}", ls="--", label=f"lr {a['lr']:g} rejected")
    right.set_xlabel("DPO step")
    right.set_ylabel("summed completion log-prob (training pairs)")
    right.legend(fontsize=8)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------

TINY = {
    "policy": "builtin:tiny",
    "sft_steps": 3,
    "sft_lr": 1e-3,
    "pair_prompts": 16,
    "samples": 4,
    "max_new_tokens": 8,
    "gen_batch": 16,
    "rm_epochs": 2,
    "rm_batch": 8,
    "rm_lr": 1e-3,
    "ppo_steps": 2,
    "eval_every": 1,
    "eval_problems": 8,
}
DEFAULT_PPO = [
    # 4 problems x 8 samples per step (the built-in demo's recipe at half the batch), so a
    # run (16 steps) took 30 min on a shared 2-core CPU (docs/rlhf.md)
    "train_dataset.batch_size=4",
]
TINY_PPO = [
    "actor.optimizer.lr=1e-4",
    "gconfig.n_samples=4",
    "gconfig.max_new_tokens=8",
    "train_dataset.batch_size=4",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="tiny random model, seconds per stage")
    p.add_argument(
        "--output-dir", default=None, help="default: outputs/rlhf-demo (tiny: a temp dir)"
    )
    p.add_argument("--policy", default=SMOLLM2, help="policy model (also samples the pairs)")
    p.add_argument(
        "--rm-base",
        default=None,
        help="model the reward model starts from (default: the SFT model, else --policy)",
    )
    p.add_argument("--sft-steps", type=int, default=30, help="SFT steps (0: no SFT stage)")
    p.add_argument("--sft-lr", type=float, default=2e-5)
    p.add_argument("--sft", nargs="*", default=[], help="extra train_sft KEY=VALUE overrides")
    p.add_argument("--pair-prompts", type=int, default=64, help="training problems sampled")
    p.add_argument("--samples", type=int, default=7, help="sampled answers per problem (+1 greedy)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--gen-batch", type=int, default=16, help="problems per generate call")
    p.add_argument("--max-pairs-per-prompt", type=int, default=4)
    p.add_argument("--valid-fraction", type=float, default=0.2, help="problems held out")
    p.add_argument("--rm-epochs", type=int, default=2)
    p.add_argument("--rm-batch", type=int, default=16, help="pairs per reward-model step")
    p.add_argument("--rm-lr", type=float, default=3e-5)
    p.add_argument("--ppo-steps", type=int, default=16)
    p.add_argument("--eval-every", default="8", help="held-out eval every N PPO steps")
    p.add_argument("--eval-problems", type=int, default=256, help="held-out problems")
    p.add_argument("--rm", nargs="*", default=[], help="extra train_rm KEY=VALUE overrides")
    p.add_argument("--ppo", nargs="*", default=[], help="extra PPO KEY=VALUE overrides")
    p.add_argument("--dpo", action="store_true", help="also SFT -> DPO on the same pairs")
    p.add_argument(
        "--dpo-lr", type=float, nargs="+", default=None, help="DPO lr, one arm each (--rm-lr)"
    )
    p.add_argument("--dpo-beta", type=float, default=0.1, help="DPO beta")
    p.add_argument("--dpo-args", nargs="*", default=[], help="extra train_dpo KEY=VALUE overrides")
    p.add_argument("--plot", default=None, help="with --dpo: write the comparison PNG here")
    args = p.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            if getattr(args, key) == p.get_default(key):
                setattr(args, key, value)
        args.ppo = [*TINY_PPO, *args.ppo]
    else:
        args.ppo = [*DEFAULT_PPO, *args.ppo]
    return args


def print_dpo(arm: dict, rm: dict) -> None:
    pairs = arm["held_out_pairs"]
    print(
        f"[DPO] SFT -> DPO (lr {arm['lr']:g}) on the same pairs: held-out pair accuracy "
        f"(implicit reward) {pairs[0]['eval/accuracy']:.3f} -> {pairs[-1]['eval/accuracy']:.3f} "
        f"on {arm['eval_pairs']:.0f} pairs (reward model: {rm['eval_accuracy']:.3f}), "
        f"{arm['steps']} steps ({arm['seconds']:.0f} s); TRUE held-out greedy accuracy "
        + ", ".join(f"step {s}: {a:.3f}" for s, a in arm["true_accuracy"]),
        flush=True,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out_dir = args.output_dir or (
        tempfile.mkdtemp(prefix="rlhf-demo-") if args.tiny else "outputs/rlhf-demo"
    )
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.perf_counter()
    label = digit_share_label if args.tiny else checker_label
    sft = None
    if args.sft_steps > 0:
        sft = cached_stage(out_dir, "sft", lambda: run_sft(args, out_dir))
        print(
            f"[0/3] SFT: held-out loss {sft['eval_loss_before']:.3f} -> {sft['eval_loss']:.3f} "
            f"nats per answer token (perplexity {sft['eval_perplexity']:.3f}), {sft['steps']} "
            f"steps ({sft['seconds']:.0f} s)",
            flush=True,
        )
        args.policy = sft["path"]  # the policy, the KL reference and the reward model's body
    if args.rm_base is None:
        args.rm_base = args.policy
    pairs = cached_stage(out_dir, "pairs", lambda: collect_pairs(args, out_dir, label))
    print(
        f"[1/3] pairs: {pairs['problems']} problems x {args.samples + 1} answers, "
        f"{pairs['labelled_right']}/{pairs['samples']} labelled right by "
        f"{'the digit share (--tiny)' if args.tiny else 'the checker (standing in for a human labeller)'}; {pairs['train_pairs']} train / {pairs['valid_pairs']} held-out "
        f"pairs ({pairs['seconds']:.0f} s)",
        flush=True,
    )
    if pairs["train_pairs"] == 0:
        raise SystemExit("no preference pairs: every problem's answers were labelled alike")
    rm = cached_stage(out_dir, "reward_model", lambda: train_reward_model(args, out_dir))
    print(
        f"[2/3] reward model: held-out pair accuracy {rm['eval_accuracy_before']:.3f} -> "
        f"{rm['eval_accuracy']:.3f} on {rm['eval_pairs']:.0f} pairs, {rm['steps']} steps "
        f"({rm['seconds']:.0f} s)",
        flush=True,
    )
    ppo = cached_stage(out_dir, "ppo", lambda: run_ppo(args, out_dir, rm["path"]))
    gap = reward_gap(ppo["per_step"], window=max(1, min(3, len(ppo["per_step"]) // 3)))
    acc = ppo["true_accuracy"]
    print(
        f"[3/3] PPO on the learned reward only: TRUE held-out greedy accuracy (checker) "
        f"{acc[0][1]:.3f} at step {acc[0][0]} -> {acc[-1][1]:.3f} at step {acc[-1][0]} "
        f"({ppo['seconds']:.0f} s)",
        flush=True,
    )
    print("step  learned(RM score)  true(sampled acc)  corr(RM, true)")
    for row in ppo["per_step"]:
        print(
            f"{row['step']:4d}  {row['learned']:+17.3f}  {row['true']:17.3f}  {row['corr']:+14.3f}"
        )
    print(
        f"learned reward {gap['learned_gain_in_std']:+.2f} std vs true reward "
        f"{gap['true_gain_points']:+.1f} points (first vs last steps); RM-true correlation "
        f"{gap['corr_first']:+.2f} -> {gap['corr_last']:+.2f}; total {time.perf_counter() - t0:.0f} s"
    )
    summary = {
        "args": vars(args),
        "sft": sft,
        "pairs": pairs,
        "reward_model": rm,
        "ppo": ppo,
        "gap": gap,
    }
    if args.dpo:
        summary["dpo"] = []
        for lr in args.dpo_lr or [args.rm_lr]:
            summary["dpo"].append(dpo_arm(args, out_dir, pairs["train_pairs"], lr))
            print_dpo(summary["dpo"][-1], rm)
        if args.plot:
            print(f"plot: {plot_comparison(summary, args.plot)}")
    summary["seconds"] = time.perf_counter() - t0
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1)
    print(f"summary: {os.path.join(out_dir, 'summary.json')}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
