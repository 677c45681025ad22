"""How many new tokens a correct answer needs: sample the base model, find for each rewarded
completion the shortest prefix that the reward still accepts, and print the distribution.

Used to choose the study's ``gconfig.max_new_tokens`` (as small as the task allows without
truncating correct answers)::

    python -m research.stale_study.length_probe --model builtin:smollm2-135m-instruct --n 128

Prompts are built as the trainer builds them (chat template); sampling is full-softmax at the
given temperature (no top-k/top-p), greedy for the evaluation's view.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from typing import Any


def shortest_rewarded_prefix(
    token_ids: list[int], decode: Any, reward: Any, answer: str, prompt: str
) -> int | None:
    """The fewest leading tokens of ``token_ids`` whose decoded text ``reward`` scores 1."""
    for k in range(1, len(token_ids) + 1):
        if reward(prompt, decode(token_ids[:k]), answer) >= 1.0:
            return k
    return None


def probe(model_path: str, n: int, samples: int, max_new_tokens: int, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.dataset.arithmetic import make_arithmetic_split
    from areal_m2po.dataset.loader import build_prompts
    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.reward.math_reward import math_reward_fn

    torch.manual_seed(seed)
    path = resolve_model_path(model_path)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    records, _ = build_prompts(make_arithmetic_split("test", n=n), tok, 1024)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    width = max(len(r["prompt_ids"]) for r in records)
    ids = torch.tensor([[pad] * (width - len(r["prompt_ids"])) + r["prompt_ids"] for r in records])
    mask = (
        torch.arange(width)[None, :]
        >= width - torch.tensor([[len(r["prompt_ids"])] for r in records])
    ).long()
    out: dict[str, Any] = {}
    for mode, k in (("greedy", 1), ("sampled", samples)):
        kw = (
            {"do_sample": False}
            if mode == "greedy"
            else {"do_sample": True, "top_k": 0, "top_p": 1.0}
        )
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                num_return_sequences=k,
                pad_token_id=pad,
                **kw,
            )[:, width:]
        needs: collections.Counter[int] = collections.Counter()
        for i, row in enumerate(gen.tolist()):
            rec = records[i // k]
            body = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
            need = shortest_rewarded_prefix(
                body,
                lambda t: tok.decode(t, skip_special_tokens=True),
                math_reward_fn,
                rec["answer"],
                rec["prompt_text"],
            )
            if need is not None:
                needs[need] += 1
        out[mode] = {
            "completions": len(gen),
            "rewarded": sum(needs.values()),
            "tokens_needed": dict(sorted(needs.items())),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m research.stale_study.length_probe", description=__doc__
    )
    p.add_argument("--model", default="builtin:smollm2-135m-instruct")
    p.add_argument("--n", type=int, default=128, help="test problems")
    p.add_argument("--samples", type=int, default=4, help="samples per problem at T=1")
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    result = probe(args.model, args.n, args.samples, args.max_new_tokens, args.seed)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
