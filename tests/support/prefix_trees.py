"""A tiny random Llama and prompts that share prefixes at several levels, for the tests of
prompt grouping (engine/prefix_tree.py), cascade attention and the decode loop."""

from __future__ import annotations

import torch

from areal_m2po.engine.builtin_models import build_tiny_llama

VOCAB = 97
INF = float("inf")


def tiny_model() -> torch.nn.Module:
    """A random 97-token Llama (hidden size 32), in eval mode."""
    model = build_tiny_llama(
        VOCAB, 0, hidden_size=32, intermediate_size=64, max_position_embeddings=256
    )
    return model.eval()


def rand_tokens(g: torch.Generator, n: int) -> list[int]:
    """``n`` random token ids in 3..VOCAB-1 drawn from ``g``."""
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def tree_prompts(seed: int = 0) -> list[list[int]]:
    """Prompts sharing parts at several levels: a common head, then two branches, one of
    which branches again; one prompt is a prefix of another; one shares nothing."""
    g = torch.Generator().manual_seed(seed)
    head, a1, a2 = rand_tokens(g, 12), rand_tokens(g, 5), rand_tokens(g, 3)
    return [
        head + a1 + rand_tokens(g, 4),
        head + a1 + rand_tokens(g, 2),
        head + a2,
        head + a1,  # a prefix of the first two
        rand_tokens(g, 6),  # nothing shared
    ]


def tree_batch(prompts: list[list[int]], sizes: list[int], seed: int = 1, pad: int = 0):
    """The rollout layout: prompts left-padded to a common column, ``sizes[i]`` completions of
    prompt i (lengths 1..6) from there, right padding; ``pad`` extra all-padding columns on
    either side."""
    g = torch.Generator().manual_seed(seed)
    p = max(len(x) for x in prompts) + pad
    n, t = sum(sizes), p + 6 + pad
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    loss = torch.zeros(n, t, dtype=torch.bool)
    row = 0
    for prompt, size in zip(prompts, sizes, strict=True):
        for _ in range(size):
            c = 6 if row == 0 else int(torch.randint(1, 7, (1,), generator=g))
            ids[row, p - len(prompt) : p] = torch.tensor(prompt)
            ids[row, p : p + c] = torch.tensor(rand_tokens(g, c))
            attn[row, p - len(prompt) : p + c] = True
            loss[row, p : p + c] = True
            row += 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """``prompts`` left-padded with 0: ``(input_ids [B, T], attention_mask [B, T])``."""
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    attn = torch.zeros(len(prompts), longest, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p) :], attn[i, longest - len(p) :] = torch.tensor(p), 1
    return ids, attn
