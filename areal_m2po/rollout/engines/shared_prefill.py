"""Sampling ``n`` completions per prompt with each prompt, and each run of tokens that several
prompts share, encoded once.

``model.generate(..., num_return_sequences=n)`` repeats every prompt ``n`` times *before* the
prefill, so a GRPO group of 8 samples runs its prompt through the model 8 times. On the
built-in demo (SmolLM2-135M, 47-token prompts, 16 new tokens, 8 x 8 samples, one CPU thread)
that prefill is 58% of the generation time, and every prompt there starts with the same 27
tokens (the chat template). :func:`generate_shared_prefill` instead runs the prompts (all but
their last token) as the levels of a prefix tree (:mod:`areal_m2po.engine.prefix_tree`:
each shared run once, ``use_cache=True``), gives each sample its prompt's cache row
(``Cache.batch_select_indices``) and lets ``generate`` continue from it in the tree's layout
(padding between segments, masked; positions from the mask): the last prompt token and every
new token are then decoded as usual, so the sampled tokens and per-step logits equal those of
the plain call with the same seed up to float rounding (``tests/unit/test_packing.py``,
``tests/unit/test_prefix_tree.py``).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import torch

from areal_m2po.engine.cascade_attention import cascade_mode, cascade_supported
from areal_m2po.engine.prefix_tree import MIN_SAVED_TOKENS, PrefixLevels, build_prefix_levels
from areal_m2po.engine.shared_prefix import cache_kwarg, prefill_levels, select_rows

__all__ = ["generate_shared_prefill"]


def generate_shared_prefill(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    generation_config: Any,
    n: int,
    min_saved_tokens: float = MIN_SAVED_TOKENS,
    cascade: bool | None = None,
    **kwargs: Any,
) -> Any:
    """``model.generate`` with ``num_return_sequences=n``, every shared run of prompt tokens
    prefilled once.

    Args:
        model: a Hugging Face causal LM (decoder-only, with a cache that supports
            ``batch_select_indices``, as ``DynamicCache`` does).
        input_ids, attention_mask: ``[P, L]`` left-padded prompts.
        generation_config: a ``transformers.GenerationConfig``; its ``num_return_sequences``
            is replaced by ``n``.
        n: samples per prompt; rows ``i * n .. i * n + n - 1`` of the output belong to prompt i.
        min_saved_tokens: where a run of tokens shared by several prompts is prefilled on its
            own (:func:`~areal_m2po.engine.prefix_tree.build_prefix_levels`; ``inf``: only
            identical prompts share, and a batch of distinct prompts is generated plainly).
        cascade: keep each level's keys and values once and decode into a preallocated buffer
            (:mod:`~areal_m2po.engine.cascade_attention`); None: where the model's attention
            allows it; False: a ``DynamicCache`` with the rows' copies.
        kwargs: passed on to ``generate`` (e.g. ``tokenizer`` for stop strings).
    Returns:
        What ``generate`` returns over ``P * n`` rows, its sequences (int64 ``[P * n, L + C]``)
        in the prompts' own layout: ``input_ids`` repeated ``n`` times, then the ``C``
        generated columns.
    """
    cfg = copy.deepcopy(generation_config)
    mask = attention_mask.long()
    heads = [row[m.bool()].tolist()[:-1] for row, m in zip(input_ids.cpu(), mask.cpu())]
    tree = None
    if all(heads):
        tree = build_prefix_levels(heads, min_saved_tokens)
        if n <= 1 and tree.computed == tree.total:
            tree = None  # nothing shared
    if tree is None:
        cfg.num_return_sequences = max(n, 1)
        return model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=cfg, **kwargs
        )
    if cascade is None:
        cascade = cascade_supported(model)
    with cascade_mode(model) if cascade else contextlib.nullcontext():
        return _generate_on_levels(model, tree, input_ids, cfg, n, cascade, **kwargs)


def _generate_on_levels(
    model: Any,
    tree: PrefixLevels,
    input_ids: torch.Tensor,
    cfg: Any,
    n: int,
    cascade: bool,
    **kwargs: Any,
) -> Any:
    """:func:`generate_shared_prefill` once the prompts' heads are in ``tree``."""
    with torch.no_grad():
        state = prefill_levels(model, tree, want_logits=False, cascade=cascade)
    rows = tree.leaf.to(input_ids.device).repeat_interleave(n)
    select_rows(state.cache, rows)
    if cascade:  # the last prompt token and every new one, written in place
        state.cache.capacity = 1 + int(getattr(cfg, "max_new_tokens", None) or 0)
    last = input_ids[:, -1:].repeat_interleave(n, 0)
    # the prompts in the levels' layout (padding between segments), their last token after
    layout_ids = torch.cat([state.ids[rows].masked_fill(state.mask[rows] == 0, _pad(cfg)), last], 1)
    layout_mask = torch.cat([state.mask[rows], torch.ones_like(last)], 1)
    cfg.num_return_sequences = 1
    seqs = model.generate(
        input_ids=layout_ids,
        attention_mask=layout_mask,
        generation_config=cfg,
        **{cache_kwarg(model): state.cache},
        **kwargs,
    )
    out = seqs.sequences if hasattr(seqs, "sequences") else seqs
    out = torch.cat([input_ids.repeat_interleave(n, 0), out[:, layout_ids.shape[1] :]], 1)
    if hasattr(seqs, "sequences"):  # return_dict_in_generate: the rest as generate gave it
        seqs.sequences = out
        return seqs
    return out


def _pad(cfg: Any) -> int:
    """The pad id the layout's gaps carry (never read: masked)."""
    pad = getattr(cfg, "pad_token_id", None)
    return int(pad) if pad is not None else 0
