"""Prefix caching across prompts (engine/prefix_tree.py): evaluation, generation and the
no-grad log-prob pass with the grouping by common prefix on and off, on the main job's
batches, with and without a long shared system prompt, side by side in one process.

Run::

    python scripts/bench/bench_prefix_cache.py                   # SmolLM2-135M, 1 thread
    python scripts/bench/bench_prefix_cache.py --threshold       # where a shared run pays
    python scripts/bench/bench_prefix_cache.py --model builtin:tiny --eval-prompts 8

Arms (interleaved rounds; ``off`` is the code before prefix caching: identical prompts share,
distinct ones do not, the cache copied per row; ``dyn`` the grouping by common prefix on the
copied ``DynamicCache``; ``hf`` the grouping with cascade attention under HF ``generate``;
``on`` the grouping with cascade attention, generation by the own decode loop (rows leave the
batch as they end, one uniform draw per row: rollout/engines/decode_loop.py) and, in the
no-grad pass, a head reused across micro-batches; ``--arms REGEX`` runs only the arms it
finds):

- ``eval``: the held-out evaluation, ``--eval-prompts`` distinct test prompts, one greedy batch
  of 16 new tokens (``HFGenerator.generate``, as the evaluator calls it).
- ``gen``: the main job's rollout batch, 8 prompts x 8 samples, sampled with one seed.
- ``nograd``: the policy's no-grad log-prob pass (proximal, reference and teacher scoring)
  over that batch, micro-batches as the engine cuts them (``shared_prefix_max_tokens_per_mb``
  = 1024).
- ``*_sys``: the same prompts (the no-grad pass: the same completions too) behind a
  ``--system-tokens`` shared system prompt.

Ratios are medians of per-round ratios: ``X_on/off`` (and ``X_dyn/off``, ``X_on/dyn``) the
speed-ups, ``X_sys_on`` the cost of the system prompt with the grouping and cascade
(``X_sys_dyn``, ``X_sys_off``: the other arms), against the same batch without it. ``--threshold`` instead times the no-grad pass over prompts
whose common head of L tokens is split out or not, for k prompts: where the ratio crosses 1,
``(k - 1) x L`` is the break-even ``MIN_SAVED_TOKENS``. The last lines are ``name=value``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, also under runpy
try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib.harness import Clock, interleaved, median_ratio, setup_process  # noqa: E402

INF = float("inf")
SYSTEM_SENTENCE = (
    "You are a careful assistant for arithmetic. Read the question, add the two numbers "
    "digit by digit from the right, carry where a column exceeds nine, check the sum, and "
    "answer with the number only. "
)


def load(model_path: str) -> tuple[Any, Any]:
    """The policy (float32, sdpa, eval mode) and its tokenizer."""
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import load_causal_lm

    tok = AutoTokenizer.from_pretrained(resolve_model_path(model_path))
    return load_causal_lm(model_path, "float32", "sdpa").eval(), tok


def system_prompt(tok: Any, n_tokens: int) -> str:
    """A system prompt of about ``n_tokens`` tokens (whole sentences, cut by tokens)."""
    ids = tok(SYSTEM_SENTENCE * (n_tokens // 8 + 1), add_special_tokens=False)["input_ids"]
    return tok.decode(ids[:n_tokens])


def prompts(tok: Any, split: str, n: int, system: str | None) -> list[list[int]]:
    """``n`` prompts of the built-in arithmetic data as the trainer builds them."""
    from areal_m2po.dataset.arithmetic import make_arithmetic_split
    from areal_m2po.dataset.loader import build_prompts

    records = make_arithmetic_split(split, n, seed=1)  # type: ignore[arg-type]
    kept, _ = build_prompts(records, tok, 4096, True, system)
    return [r["prompt_ids"] for r in kept]


def relayout(batch: dict[str, Any], new_prompts: list[list[int]], n: int, pad: int) -> Any:
    """``batch`` (rows ``i * n ..`` sampled from prompt i) with every prompt replaced by
    ``new_prompts[i]``: the same completions behind other prompts, left-padded again."""
    import torch

    start = int(batch["loss_mask"].any(0).to(torch.int8).argmax())
    p = max(len(x) for x in new_prompts)
    rows, width = batch["input_ids"].shape[0], batch["input_ids"].shape[1] - start
    out = {
        "input_ids": torch.full((rows, p + width), pad, dtype=torch.long),
        "attention_mask": torch.zeros(rows, p + width, dtype=torch.bool),
        "loss_mask": torch.zeros(rows, p + width, dtype=torch.bool),
    }
    for r in range(rows):
        prompt = torch.tensor(new_prompts[r // n])
        out["input_ids"][r, p - len(prompt) : p] = prompt
        out["attention_mask"][r, p - len(prompt) : p] = True
        out["input_ids"][r, p:] = batch["input_ids"][r, start:]
        out["attention_mask"][r, p:] = batch["attention_mask"][r, start:]
        out["loss_mask"][r, p:] = batch["loss_mask"][r, start:]
    return out


def score(
    model: Any,
    batch: dict[str, Any],
    min_saved: float,
    budget: int = 1024,
    cascade: bool | None = None,
) -> Any:
    """The engine's shared-prefix no-grad pass (``TrainEngine.forward_tokens``): prompt groups
    cut within ``budget`` tokens, each micro-batch scored on its prefix tree (``cascade``:
    the levels' KV once and a head reused across micro-batches, or False: copied per row)."""
    import torch

    from areal_m2po.engine.shared_prefix import (
        HeadStore,
        forward_logprobs_shared_prefix,
        shared_prefix_split,
    )

    logp = torch.zeros(batch["input_ids"].shape, dtype=torch.float32)
    store = HeadStore()  # one per pass, as the engine's; unused without the cascade
    with torch.no_grad():
        for idx in shared_prefix_split(batch, budget) or [torch.arange(logp.shape[0])]:
            mb = {k: v.index_select(0, idx) for k, v in batch.items()}
            logp[idx] = forward_logprobs_shared_prefix(
                model, mb, 1.0, False, min_saved, cascade, store
            )[0]
    return logp


def main_arms(args: argparse.Namespace, model: Any, tok: Any) -> dict[str, Any]:
    """The timed functions of the default mode, and the results they leave."""
    import torch

    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.engine.prefix_tree import MIN_SAVED_TOKENS
    from areal_m2po.rollout.engines.hf_generator import HFGenerator

    gen = HFGenerator(model, tok, torch.device("cpu"), share=True)
    g = GenerationConfig(n_samples=args.n_samples, max_new_tokens=16, temperature=1.0)
    system = system_prompt(tok, args.system_tokens)
    eval_prompts = prompts(tok, "test", args.eval_prompts, None)
    train, train_sys = (prompts(tok, "train", args.prompts, s) for s in (None, system))
    batch = gen.generate(train, g, seed=0)
    batch_sys = relayout(batch, train_sys, args.n_samples, gen.pad_id)
    results: dict[str, Any] = {}

    def arm(
        name: str, kind: str, min_saved: float, sys_prompt: bool, cascade: Any, loop: bool
    ) -> None:
        def run() -> None:
            gen.min_saved_tokens, gen.cascade, gen.decode_loop = min_saved, cascade, loop
            if kind == "eval":
                results[name] = gen.generate(eval_prompts, g, greedy=True)["input_ids"]
            elif kind == "gen":
                results[name] = gen.generate(train_sys if sys_prompt else train, g, seed=1)
            else:
                results[name] = score(
                    model, batch_sys if sys_prompt else batch, min_saved, cascade=cascade
                )

        fns[name] = run

    fns: dict[str, Any] = {}
    for kind in ("eval", "gen", "nograd"):
        for suffix, min_saved, sys_prompt, cascade, loop in (
            ("off", INF, False, False, False),
            ("dyn", MIN_SAVED_TOKENS, False, False, False),
            ("hf", MIN_SAVED_TOKENS, False, None, False),
            ("on", MIN_SAVED_TOKENS, False, None, True),
            ("sys_off", INF, True, False, False),
            ("sys_dyn", MIN_SAVED_TOKENS, True, False, False),
            ("sys_hf", MIN_SAVED_TOKENS, True, None, False),
            ("sys_on", MIN_SAVED_TOKENS, True, None, True),
        ):
            name = f"{kind}_{suffix}"
            skip = (kind == "eval" and sys_prompt) or (kind == "nograd" and suffix.endswith("hf"))
            if not skip and re.search(args.arms, name):
                arm(name, kind, min_saved, sys_prompt, cascade, loop)
    shapes = {
        "eval prompts": len(eval_prompts),
        "prompt tokens": len(train[0]),
        "with system prompt": len(train_sys[0]),
        "batch rows": int(batch["input_ids"].shape[0]),
    }
    return {"fns": fns, "results": results, "batch": batch, "shapes": shapes}


def report(
    model: Any, times: dict[str, list[float]], results: dict[str, Any], batch: Any
) -> dict[str, float]:
    """Print the medians, the ratios and the arms' agreement; return the ratios."""
    import torch

    for name, secs in times.items():
        print(f"{name:>14}: {statistics.median(secs):8.3f} s")
    pairs = {}
    for kind in ("eval", "gen", "nograd"):
        pairs[f"{kind}_on/off"] = (f"{kind}_on", f"{kind}_off")
        pairs[f"{kind}_dyn/off"] = (f"{kind}_dyn", f"{kind}_off")
        pairs[f"{kind}_on/dyn"] = (f"{kind}_on", f"{kind}_dyn")
        pairs[f"{kind}_hf/off"] = (f"{kind}_hf", f"{kind}_off")
        pairs[f"{kind}_on/hf"] = (f"{kind}_on", f"{kind}_hf")
        if kind != "eval":
            for mode in ("on", "hf", "dyn", "off"):
                pairs[f"{kind}_sys_{mode}"] = (f"{kind}_sys_{mode}", f"{kind}_{mode}")
    figures = {
        k: median_ratio(times[a], times[b])
        for k, (a, b) in pairs.items()
        if a in times and b in times
    }
    mask = batch["loss_mask"]
    for kind in ("eval", "gen", "nograd"):
        for mode in ("on", "hf", "dyn"):
            a, b = results.get(f"{kind}_{mode}"), results.get(f"{kind}_off")
            if a is None:
                continue
            if kind == "gen" and mode == "on":
                # another random stream than generate's: the log-probs against a forward pass
                plain = score(model, a, INF, cascade=False)
                m = a["loss_mask"]
                figures["gen_on_max_abs_dlogp_vs_forward"] = float(
                    (a["behave_logp"] - plain)[m].abs().max()
                )
            elif b is None:
                continue
            elif kind == "nograd":
                figures[f"nograd_{mode}_max_abs_dlogp"] = float((a - b)[mask].abs().max())
            else:
                a, b = (x if kind == "eval" else x["input_ids"] for x in (a, b))
                figures[f"{kind}_{mode}_same_tokens"] = float(torch.equal(a, b))
    return figures


def threshold_arms(model: Any, heads: tuple[int, ...], ks: tuple[int, ...]) -> dict[str, Any]:
    """Per k and head length L: k prompts (a common head of L tokens, distinct 20-token
    tails), one 4-token completion each (so the prefill dominates), scored with the head
    split out or not."""
    import torch

    g = torch.Generator().manual_seed(0)
    vocab = int(model.config.vocab_size)
    low = min(100, vocab // 2)  # clear of the special tokens
    fns: dict[str, Any] = {}
    for k in ks:
        for length in heads:
            head = torch.randint(low, vocab, (length,), generator=g).tolist()
            rows = []
            for _ in range(k):
                tail = torch.randint(low, vocab, (20,), generator=g).tolist()
                rows.append((head + tail, torch.randint(low, vocab, (4,), generator=g)))
            p = max(len(x) for x, _ in rows)
            ids = torch.zeros(len(rows), p + 4, dtype=torch.long)
            for r, (prompt, comp) in enumerate(rows):
                ids[r, p - len(prompt) : p], ids[r, p:] = torch.tensor(prompt), comp
            attn = ids != 0
            loss = torch.zeros_like(attn)
            loss[:, p:] = True
            b = {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}
            for split, ms in (("split", 0.0), ("whole", INF)):
                fns[f"k{k}_L{length}_{split}"] = lambda b=b, ms=ms: score(model, b, ms, 10**9)
    return fns


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="builtin:smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu")
    ap.add_argument("--eval-prompts", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n-samples", type=int, default=8)
    ap.add_argument("--system-tokens", type=int, default=300)
    ap.add_argument("--arms", default="", help="a regex: only the arms it finds")
    ap.add_argument("--threshold", action="store_true", help="time where a shared run pays")
    ap.add_argument("--heads", default="2,4,8,16,32")
    ap.add_argument("--ks", default="2,8,32")
    args = ap.parse_args(argv)
    setup_process(args.threads, "no")
    import torch

    model, tok = load(args.model)
    clock = Clock(torch.device("cpu"), args.clock)
    if args.threshold:
        heads = tuple(int(x) for x in args.heads.split(","))
        ks = tuple(int(x) for x in args.ks.split(","))
        times = interleaved(threshold_arms(model, heads, ks), args.rounds, clock)
        figures = {}
        for k in ks:
            for length in heads:
                a, b = f"k{k}_L{length}_split", f"k{k}_L{length}_whole"
                figures[f"k{k}_L{length}_split/whole"] = median_ratio(times[a], times[b])
                print(f"k={k} L={length:3d} saved={(k - 1) * length:4d}: "
                      f"{statistics.median(times[a]):.3f} s vs {statistics.median(times[b]):.3f} s")  # fmt: skip
    else:
        built = main_arms(args, model, tok)
        print(", ".join(f"{k}: {v}" for k, v in built["shapes"].items()))
        times = interleaved(built["fns"], args.rounds, clock)
        figures = report(model, times, built["results"], built["batch"])
    print(f"threads {args.threads}, {clock.kind} seconds, {args.rounds} rounds")
    for key, value in figures.items():
        print(f"{key}={value:.4f}")
    return figures


if __name__ == "__main__":
    main()
