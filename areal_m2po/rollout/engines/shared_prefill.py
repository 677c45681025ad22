"""Sampling ``n`` completions per prompt with each prompt encoded once.

``model.generate(..., num_return_sequences=n)`` repeats every prompt ``n`` times *before* the
prefill, so a GRPO group of 8 samples runs its prompt through the model 8 times. On the
built-in demo (SmolLM2-135M, 47-token prompts, 16 new tokens, 8 x 8 samples, one CPU thread)
that prefill is 58% of the generation time. :func:`generate_shared_prefill` instead runs the
prompts once (all but their last token, ``use_cache=True``), repeats the KV cache ``n`` times
(``Cache.batch_repeat_interleave``) and lets ``generate`` continue from it: the last prompt token
and every new token are then decoded as usual, so the sampled tokens and per-step logits equal
those of the plain call with the same seed (``tests/unit/test_packing.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from areal_m2po.engine.shared_prefix import cache_kwarg

__all__ = ["generate_shared_prefill"]


def generate_shared_prefill(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    generation_config: Any,
    n: int,
    **kwargs: Any,
) -> Any:
    """``model.generate`` with ``num_return_sequences=n``, each prompt prefilled once.

    Args:
        model: a Hugging Face causal LM (decoder-only, with a cache that supports
            ``batch_repeat_interleave``, as ``DynamicCache`` does).
        input_ids, attention_mask: ``[P, L]`` left-padded prompts.
        generation_config: a ``transformers.GenerationConfig``; its ``num_return_sequences``
            is replaced by ``n``.
        n: samples per prompt; rows ``i * n .. i * n + n - 1`` of the output belong to prompt i.
        kwargs: passed on to ``generate`` (e.g. ``tokenizer`` for stop strings).
    Returns:
        What ``generate`` returns, over ``P * n`` rows.
    """
    cfg = copy.deepcopy(generation_config)
    if n <= 1 or input_ids.shape[1] < 2:
        cfg.num_return_sequences = max(n, 1)
        return model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=cfg, **kwargs
        )
    mask = attention_mask.long()
    # the positions generate() gives a left-padded prompt
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with torch.no_grad():
        out = model(
            input_ids=input_ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=position_ids[:, :-1],
            use_cache=True,
            logits_to_keep=1,
        )
    name = cache_kwarg(model)
    cache = getattr(out, name)
    cache.batch_repeat_interleave(n)
    cfg.num_return_sequences = 1
    return model.generate(
        input_ids=input_ids.repeat_interleave(n, 0),
        attention_mask=mask.repeat_interleave(n, 0),
        generation_config=cfg,
        **{name: cache},
        **kwargs,
    )
