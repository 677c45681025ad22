"""The shared-prefix pass's gradient is the same bits on every backward at 2 threads (issue 55).

The rows of a prompt take their prompt's last logits and cache rows by an index that repeats
each prompt once per row. Indexed as ``x[idx]``, the backward adds those rows with torch's
parallel ``index_put_(accumulate=True)``, whose atomic float adds land in thread order once the
values exceed 32,768 elements: a vocabulary of 16,384 over 8 rows of one prompt is past that.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import DynamicCache

from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.shared_prefix import forward_logprobs_shared_prefix, select_rows

VOCAB = 16_384


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _batch(rows: int = 8, prompt: int = 6, new: int = 5) -> dict[str, torch.Tensor]:
    """One prompt's ``rows`` samples (the GRPO group of one micro-batch), all of length
    ``new``."""
    g = torch.Generator().manual_seed(3)
    head = torch.randint(3, VOCAB, (prompt,), generator=g)
    tails = torch.randint(3, VOCAB, (rows, new), generator=g)
    ids = torch.cat([head.expand(rows, prompt), tails], 1)
    loss = torch.zeros_like(ids, dtype=torch.bool)
    loss[:, prompt:] = True
    return {"input_ids": ids, "attention_mask": torch.ones_like(loss), "loss_mask": loss}


@pytest.mark.parametrize("cascade", [True, False])
def test_the_gradient_is_the_same_on_every_backward(two_threads: None, cascade: bool) -> None:
    model = build_tiny_llama(VOCAB, 0, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    batch = _batch()
    grads = []
    for _ in range(8):
        model.zero_grad(set_to_none=True)
        logp, _ = forward_logprobs_shared_prefix(model, batch, 1.0, False, cascade=cascade)
        (logp * batch["loss_mask"]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    differ = sum(not torch.equal(grads[0], g) for g in grads[1:])
    assert differ == 0, f"{differ} of 7 backward passes gave other gradient bits"


def test_select_rows_repeats_rows_of_a_transformers_cache() -> None:
    """The copy of a ``DynamicCache``'s rows (the pass without the cascade) keeps every layer's
    keys and values of the chosen rows, in order, repeats included."""
    cache = DynamicCache()
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).view(2, 1, 3, 2)
    cache.update(keys, -keys, 0)
    rows = torch.tensor([1, 1, 0])
    select_rows(cache, rows)
    assert torch.equal(cache.layers[0].keys, keys[rows])
    assert torch.equal(cache.layers[0].values, -keys[rows])
