"""Generation without HF ``generate``: the prompts' prefix tree prefilled once, then a decode
loop over the cascade cache that stops computing a row as soon as it ends.

HF ``generate`` keeps every row of the batch in every step until the last row ends: the
built-in demo's held-out greedy answers end after 9 to 16 of their 16 tokens, and a sixth of
its decode rows were finished ones. Here a row that ends (an EOS or stop token, or a stopping
criterion) leaves the batch and the cache (:meth:`CascadeCache.keep_rows`); its later columns
are padding, as ``generate`` pads them. The next token comes from
:func:`~areal_m2po.rollout.engines.sampling.next_tokens` (greedy: the tokens ``generate``
gives; sampled: an exact draw, from another random stream than ``torch.multinomial``'s), and
its behaviour log-prob from the same logits. Top-k, top-p and a minimum length are left to
``generate`` (:func:`decode_supported`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from areal_m2po.engine.cascade_attention import cascade_mode, cascade_supported
from areal_m2po.engine.prefix_tree import build_prefix_levels
from areal_m2po.engine.shared_prefix import cache_kwarg, prefill_levels, select_rows
from areal_m2po.rollout.engines.sampling import next_tokens

__all__ = ["StopCheck", "decode", "decode_supported"]

# (rows still decoding: int64 [A] indices into the batch, their generated tokens int64
# [A, steps]) -> bool [A], True where a row ends
StopCheck = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def decode_supported(model: torch.nn.Module, prompts: list[list[int]]) -> bool:
    """Whether :func:`decode` runs these prompts on this model: attention the cascade
    reproduces, and every prompt at least two tokens (a head to prefill, a last token to
    decode from)."""
    return cascade_supported(model) and all(len(p) >= 2 for p in prompts)


@torch.no_grad()
def decode(
    model: torch.nn.Module,
    prompts: list[list[int]],
    n: int,
    max_new_tokens: int,
    temperature: float | None,
    eos_ids: list[int],
    pad_id: int,
    min_saved_tokens: float,
    stop: StopCheck | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` completions of every prompt: rows ``i * n .. i * n + n - 1`` belong to prompt i.

    Args:
        model: a causal LM in eval mode for which :func:`decode_supported` holds.
        prompts: token ids, each of at least two tokens.
        n: completions per prompt.
        max_new_tokens: the most tokens a completion gets (>= 1).
        temperature: None for greedy, else the sampling temperature.
        eos_ids: tokens that end a completion (kept in it).
        pad_id: what fills a completion's columns after its end.
        min_saved_tokens: where a run of tokens shared by several prompts is prefilled on its
            own (:func:`~areal_m2po.engine.prefix_tree.build_prefix_levels`).
        stop: called after every step with the rows still decoding and their tokens so far;
            True ends a row there (its last token kept).
    Returns:
        ``tokens`` int64 ``[P * n, C]`` and their behaviour log-probs ``logp`` float32
        ``[P * n, C]`` (0 when greedy and after a row's end), ``C`` the steps run: at most
        ``max_new_tokens``, fewer when every row ended sooner.
    """
    if max_new_tokens < 1:
        raise ValueError(f"decode: max_new_tokens must be >= 1, got {max_new_tokens}")
    dev = next(model.parameters()).device
    tree = build_prefix_levels([p[:-1] for p in prompts], min_saved_tokens)
    rows = tree.leaf.to(dev).repeat_interleave(n)
    b = rows.numel()
    tokens = torch.full((b, max_new_tokens), pad_id, dtype=torch.long, device=dev)
    logp = torch.zeros(b, max_new_tokens, dtype=torch.float32, device=dev)
    eos = torch.tensor(eos_ids, dtype=torch.long, device=dev)
    name = cache_kwarg(model)
    with cascade_mode(model):
        state = prefill_levels(model, tree, want_logits=False, cascade=True)
        cache: Any = state.cache
        select_rows(cache, rows)
        cache.capacity = max_new_tokens  # the last prompt token and all new ones but the last
        token = torch.tensor([p[-1] for p in prompts], device=dev).repeat_interleave(n)
        position = state.length[rows]  # the last prompt token's: the real tokens before it
        active = torch.arange(b, device=dev)
        steps = 0
        while True:
            out = model(
                input_ids=token[:, None],
                position_ids=position[:, None],
                use_cache=True,
                logits_to_keep=1,
                **{name: cache},
            )
            token, token_logp = next_tokens(out.logits[:, -1], temperature)
            tokens[active, steps] = token
            logp[active, steps] = token_logp
            steps += 1
            done = torch.isin(token, eos)
            if stop is not None:
                done |= stop(active, tokens[active, :steps]).to(dev)
            if steps == max_new_tokens or bool(done.all()):
                break
            if bool(done.any()):
                keep = (~done).nonzero()[:, 0]
                cache.keep_rows(keep)
                active, token, position = active[keep], token[keep], position[keep]
            position = position + 1
    return tokens[:, :steps], logp[:, :steps]
