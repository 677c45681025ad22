"""Figure ``logprob_peak_mem_ratio``: peak memory allocated while computing per-token log-probs
and entropies (forward, then forward + backward) over the size of the logits tensor, for the
engine's chunked path and a full ``log_softmax`` path."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from areal_m2po.engine.forward import token_logprobs


def _walk(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def peak_extra_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated above the level at entry while ``fn`` runs (what it keeps counts)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    allocs = sorted(
        (n for n in _walk(tree) if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns
    )
    cur = peak = 0
    for a in allocs:
        cur += a.extra_fields.alloc_size
        peak = max(peak, cur)
    return peak


def logprob_memory(
    n_rows: int, vocab: int, device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """Peak extra memory / logits size: engine path vs full log_softmax, no-grad and training."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n_rows, vocab, generator=g).to(device=device, dtype=dtype)
    labels = torch.randint(0, vocab, (n_rows,), generator=g).to(device)
    size = logits.numel() * logits.element_size()
    grad_out = torch.randn(n_rows, generator=g).to(device)

    def ours_fwd() -> None:
        with torch.no_grad():
            token_logprobs(logits, labels, 1.0, True)

    def full_fwd() -> None:
        with torch.no_grad():
            x = torch.log_softmax(logits.float(), -1)
            x.gather(-1, labels[:, None])
            -(x.exp() * x).sum(-1)

    def ours_train() -> None:
        leaf = logits.detach().requires_grad_(True)
        lp, _ = token_logprobs(leaf, labels, 1.0, True)
        (lp * grad_out).sum().backward()

    def full_train() -> None:
        leaf = logits.detach().requires_grad_(True)
        x = torch.log_softmax(leaf.float(), -1)
        lp = x.gather(-1, labels[:, None]).squeeze(-1)
        with torch.no_grad():
            -(x.exp() * x).sum(-1)
        (lp * grad_out).sum().backward()

    out = {}
    for name, fn in (
        ("ours_fwd", ours_fwd),
        ("full_fwd", full_fwd),
        ("ours_train", ours_train),
        ("full_train", full_train),
    ):
        fn()  # warm-up
        out[name] = peak_extra_bytes(fn, device) / size
    out["logits_mb"] = size / 2**20
    out["vocab"] = float(vocab)
    return out
