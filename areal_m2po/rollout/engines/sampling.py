"""The next token of each row from its logits: greedy, or sampled at a temperature.

Sampling draws one uniform number per row and finds it in the row's cumulative distribution
(float64), an exact draw from ``softmax(logits / T)``. ``torch.multinomial``, which HF
``generate`` calls, draws one exponential number per vocabulary entry instead: 64 rows x 49,152
entries took 61 ms a step on one CPU thread here, 14% of the built-in demo's generation (its
forward pass is about 300 ms). Pure tensor maths: no model.
"""

from __future__ import annotations

import torch

__all__ = ["next_tokens"]


def next_tokens(
    logits: torch.Tensor, temperature: float | None, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of every row and its behaviour log-prob.

    Args:
        logits: ``[B, V]`` raw logits of the last position (any float dtype).
        temperature: ``None`` for greedy (the first maximum, as ``torch.argmax``); else > 0.
        generator: the random stream (None: torch's default one, seeded by ``manual_seed``).
    Returns:
        ``tokens`` int64 ``[B]`` and ``logp`` float32 ``[B]``: ``log softmax(logits / T)`` of
        each sampled token over the full vocabulary, computed in float32 as ``logits.float() / T``
        minus its ``logsumexp``; zeros when greedy.
    Raises:
        ValueError: a row's logits hold NaN or are all ``-inf``/``inf`` (no distribution).
    """
    if temperature is None:
        tokens = logits.argmax(-1)
        return tokens, torch.zeros(tokens.shape, dtype=torch.float32, device=logits.device)
    if not temperature > 0:
        raise ValueError(f"next_tokens: temperature must be > 0, got {temperature}")
    scaled = logits.float() / temperature
    lse = torch.logsumexp(scaled, -1, keepdim=True)  # [B, 1]
    cdf = torch.softmax(scaled, -1).double().cumsum_(-1)  # [B, V]
    total = cdf[:, -1:]
    bad = ~torch.isfinite(lse[:, 0]) | ~(total[:, 0] > 0)
    if bool(bad.any()):
        rows = bad.nonzero()[:, 0].tolist()
        raise ValueError(
            f"next_tokens: the logits of rows {rows[:8]} hold NaN or no finite value; "
            "there is no distribution to sample from"
        )
    u = torch.rand(total.shape, dtype=torch.float64, device=logits.device, generator=generator)
    # strictly below the total, so the draw lands on a token of positive probability
    u = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    tokens = torch.searchsorted(cdf, u, right=True)[:, 0]
    logp = (scaled.gather(-1, tokens[:, None]) - lse)[:, 0]
    return tokens, logp
