"""What the micro-batch token budget (``actor.mb_spec.max_tokens_per_mb``) costs in speed and
saves in memory, at the main job's step shape, every budget timed side by side in one run.

Run::

    python scripts/bench/bench_mb_budget.py                           # 256,512,1024,none; 3 rounds
    python scripts/bench/bench_mb_budget.py --budgets 256,none --repeats 5

One policy (``configs/default.yaml``'s actor: SmolLM2-135M-Instruct fp32, decoupled PPO loss,
M2PO global, packing on, AdamW) and its rollout copy, one thread. Each round generates the main
job's batch (8 arithmetic prompts x 8 samples, 16 new tokens; rewards drawn so every group has
both values: all 64 rows are trained, ``actor.skip_zero_adv_seqs=false``, the main job's
largest step), then for every budget (in an order rotated per round) times the proximal
log-prob recompute (``compute_logp``, no grad) and the update (``ppo_update``: forward,
backward, clipping, AdamW) on that same batch. A step is generation + recompute + update
(the weight sync and the advantages do not depend on the budget). Clock: this process's CPU
time (``--clock wall`` for wall time); ratios are medians of per-round ratios against the last
budget listed (by default none: one micro-batch).

Memory: after the timed rounds, one more update and one recompute per budget run under
``torch.profiler(profile_memory=True)`` (``benchlib/alloc_profile.py``); the figure is the
allocation peak above the call's entry; the update's includes the gradients (0.54 GB,
allocated by the first backward: ``zero_grad(set_to_none=True)`` frees them after every
step) and the optimizer step's temporaries. It is what the budget bounds; the resident set
adds the persistent state and what glibc keeps (``bench_memory.py``). The last lines are
``name=value``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, also under runpy
try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from benchlib.alloc_profile import live_at_peak  # noqa: E402
from benchlib.harness import Clock, median_ratio, setup_process  # noqa: E402

GB = 1e9


def _budget(text: str) -> int | None:
    return None if text.lower() in ("none", "null") else int(text)


def _name(budget: int | None) -> str:
    return "none" if budget is None else str(budget)


def build(args: argparse.Namespace) -> dict[str, Any]:
    """The main job's actor, its rollout copy, tokenizer and training prompts."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from areal_m2po.api.config_loader import load_config
    from areal_m2po.dataset.arithmetic import make_arithmetic_split
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.rollout.engines.hf_generator import HFGenerator
    from areal_m2po.trainer.ppo.actor import PPOActor

    cfg = load_config(["--config", args.config, "actor.skip_zero_adv_seqs=false"])
    engine = HFTrainEngine(cfg.actor, Accelerator(cpu=True), total_steps=1000)
    g = cfg.gconfig
    actor = PPOActor(cfg.actor, engine, g.n_samples, g.max_new_tokens)
    tok = AutoTokenizer.from_pretrained(resolve_model_path(cfg.actor.path))
    rollout = HFGenerator(engine.unwrapped, tok, torch.device("cpu"))
    rows = make_arithmetic_split("train", cfg.train_dataset.batch_size * (args.repeats + 2))
    prompts = [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": r["question"]}],
                add_generation_prompt=True,
                tokenize=False,
            )
        )["input_ids"]
        for r in rows
    ]
    return {"cfg": cfg, "actor": actor, "rollout": rollout, "prompts": prompts}


def make_batch(ctx: dict[str, Any], round_no: int) -> tuple[dict[str, torch.Tensor], float]:
    """One generated batch of the main job's shape with advantages, and its generation time."""
    cfg, actor = ctx["cfg"], ctx["actor"]
    n_prompts = cfg.train_dataset.batch_size
    prompts = ctx["prompts"][round_no * n_prompts : (round_no + 1) * n_prompts]
    clock: Clock = ctx["clock"]
    t0 = clock.now()
    batch = ctx["rollout"].generate(prompts, cfg.gconfig, seed=round_no)
    gen_s = clock.now() - t0
    n = cfg.gconfig.n_samples
    g = torch.Generator().manual_seed(round_no)
    rewards = (torch.rand(len(prompts), n, generator=g) < 0.5).float()
    rewards[:, 0], rewards[:, 1] = 0.0, 1.0  # both values in every group: every row trained
    batch["rewards"] = rewards.reshape(-1)
    batch["prox_logp"] = actor.compute_logp(batch)
    actor.compute_advantages(batch)
    return batch, gen_s


def time_round(
    ctx: dict[str, Any], batch: dict[str, torch.Tensor], budgets: list[int | None]
) -> dict[str, tuple[float, float]]:
    """``{budget: (recompute s, update s)}`` on ``batch``."""
    actor, clock = ctx["actor"], ctx["clock"]
    spec = actor.engine.config.mb_spec
    out = {}
    for b in budgets:
        spec.max_tokens_per_mb = b
        t0 = clock.now()
        actor.compute_logp(batch)
        t1 = clock.now()
        actor.ppo_update(dict(batch))
        out[_name(b)] = (t1 - t0, clock.now() - t1)
    return out


def alloc_peaks(
    ctx: dict[str, Any], batch: dict[str, torch.Tensor], budgets: list[int | None]
) -> dict[str, dict[str, float]]:
    """Allocation peak (GB above entry) of one recompute and one update per budget."""
    actor = ctx["actor"]
    spec = actor.engine.config.mb_spec
    out = {}
    for b in budgets:
        spec.max_tokens_per_mb = b
        n_mbs = len(actor.engine.micro_batches(batch))
        prox, _ = live_at_peak(lambda: actor.compute_logp(batch))
        upd, _ = live_at_peak(lambda: actor.ppo_update(dict(batch)))
        out[_name(b)] = {"micro_batches": n_mbs, "recompute_gb": prox / GB, "update_gb": upd / GB}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[2] / "configs/default.yaml")
    )
    ap.add_argument("--budgets", default="256,512,1024,none", help="the last is the reference")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    args = ap.parse_args(argv)
    budgets = [_budget(b) for b in args.budgets.split(",")]
    setup_process(args.threads, "no")
    ctx = build(args)
    ctx["clock"] = Clock(torch.device("cpu"), args.clock)
    batch, _ = make_batch(ctx, 0)
    time_round(ctx, batch, budgets)  # warm-up: AdamW state, the packing check
    gen: list[float] = []
    times: dict[str, list[tuple[float, float]]] = {_name(b): [] for b in budgets}
    for r in range(args.repeats):
        batch, gen_s = make_batch(ctx, r + 1)
        gen.append(gen_s)
        order = budgets[r % len(budgets) :] + budgets[: r % len(budgets)]
        for k, v in time_round(ctx, batch, order).items():
            times[k].append(v)
        print(f"round {r + 1}: gen {gen_s:.1f}s " + json.dumps(times), file=sys.stderr)
    peaks = alloc_peaks(ctx, batch, budgets)
    ref = _name(budgets[-1])

    def step(k: str) -> list[float]:
        return [g + p + u for g, (p, u) in zip(gen, times[k])]

    figures: dict[str, Any] = {
        "rows": int(batch["input_ids"].shape[0]),
        "columns": int(batch["input_ids"].shape[1]),
        "reference_budget": ref,
        "clock": args.clock,
        "generation_s": statistics.median(gen),
    }
    for k, ts in times.items():
        figures[k] = {
            "recompute_s": statistics.median(p for p, _ in ts),
            "update_s": statistics.median(u for _, u in ts),
            "step_s": statistics.median(step(k)),
            "update_time_ratio": median_ratio([u for _, u in ts], [u for _, u in times[ref]]),
            "step_time_ratio": median_ratio(step(k), step(ref)),
            **peaks[k],
            "update_peak_ratio": peaks[k]["update_gb"] / peaks[ref]["update_gb"],
        }
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    for k in times:
        f = figures[k]
        print(f"step_time_ratio@{k}={f['step_time_ratio']:.3f}")
        print(f"update_time_ratio@{k}={f['update_time_ratio']:.3f}")
        print(f"update_peak_ratio@{k}={f['update_peak_ratio']:.3f}")
    return figures


if __name__ == "__main__":
    main()
