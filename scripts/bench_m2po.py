"""Benchmark the M2PO mask: selection path vs the sort-based reference, and vs a PPO update.

Run: ``python scripts/bench_m2po.py [--repeats 21] [--skip-update]``

Everything runs on one CPU thread (``torch.set_num_threads(1)``), and every comparison is
timed side by side in the same run (interleaved repeats, median), so the printed ratios are
meaningful on a shared machine even when absolute times drift. The last lines are
``name=value``, one figure per line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from areal_m2po.utils.functional import (  # noqa: E402
    apply_m2po_masking,
    gather_logprobs_entropy,
    m2po_keep_mask,
    m2po_keep_mask_sorted_reference,
    ppo_actor_loss_fn,
)

B, T, VALID_FRAC = 64, 4096, 0.7


def _median_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Interleaved timing: each repeat runs every fn once; returns median seconds per fn."""
    for fn in fns.values():  # warm-up
        fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def _reference_apply(
    old: torch.Tensor, prox: torch.Tensor, mask: torch.Tensor, thr: float
) -> torch.Tensor:
    """AReaL-style end to end: gather valid tokens, sort-based rule, scatter back."""
    d = old[mask] - prox[mask]
    keep = m2po_keep_mask_sorted_reference(d * d, thr)
    out = torch.zeros_like(mask)
    out[mask] = keep
    return out


def _make_inputs(g: torch.Generator) -> dict[str, object]:
    """[64, 4096] log-probs with 70% valid tokens and two m2 regimes.

    * none-masked: proximal drifts from behaviour by N(0, 0.1^2) per token (m2 mean ~0.01),
      threshold 0.04 -> the total mean is already below it;
    * half-masked: heavy-tailed drift (log-normal |d|, stale rollouts), threshold set to the
      mean of the smallest half of the m2 values -> about half the tokens are masked.
    """
    mask = torch.rand(B, T, generator=g) < VALID_FRAC
    old = -torch.rand(B, T, generator=g) * 4.0
    prox_none = old + 0.1 * torch.randn(B, T, generator=g)
    log_abs = torch.randn(B, T, generator=g) * 1.5 - 2.5
    sign = torch.where(torch.rand(B, T, generator=g) < 0.5, -1.0, 1.0)
    prox_half = old + sign * torch.exp(log_abs)
    m2_none = ((old - prox_none)[mask]) ** 2
    m2_half = ((old - prox_half)[mask]) ** 2
    srt, _ = torch.sort(m2_half)
    thr_half = float(srt[: srt.numel() // 2].double().mean()) * (1 + 1e-6)
    return {
        "mask": mask,
        "old": old,
        "prox_none": prox_none,
        "prox_half": prox_half,
        "m2_none": m2_none,
        "m2_half": m2_half,
        "thr_none": 0.04,
        "thr_half": thr_half,
    }


def _bench_m2po(repeats: int) -> dict[str, float]:
    d = _make_inputs(torch.Generator().manual_seed(0))
    out: dict[str, float] = {}
    mask = d["mask"]
    out["m2po_n_valid"] = float(mask.sum())
    for regime in ("none", "half"):
        m2, thr = d[f"m2_{regime}"], d[f"thr_{regime}"]
        prox = d[f"prox_{regime}"]
        fast = m2po_keep_mask(m2, thr)
        ref = m2po_keep_mask_sorted_reference(m2, thr)
        assert torch.equal(fast, ref), f"mismatch in regime {regime}"
        e2e_fast = apply_m2po_masking(d["old"], prox, mask, thr)
        assert torch.equal(e2e_fast, _reference_apply(d["old"], prox, mask, thr))
        out[f"m2po_masked_fraction_{regime}_masked"] = 1.0 - float(fast.float().mean())
        t = _median_times(
            {
                "ref": lambda m2=m2, thr=thr: m2po_keep_mask_sorted_reference(m2, thr),
                "fast": lambda m2=m2, thr=thr: m2po_keep_mask(m2, thr),
                "ref_e2e": lambda p=prox, thr=thr: _reference_apply(d["old"], p, mask, thr),
                "fast_e2e": lambda p=prox, thr=thr: apply_m2po_masking(d["old"], p, mask, thr),
            },
            repeats,
        )
        out[f"m2po_ref_ms_{regime}_masked"] = 1e3 * t["ref"]
        out[f"m2po_fast_ms_{regime}_masked"] = 1e3 * t["fast"]
        out[f"m2po_speedup_{regime}_masked"] = t["ref"] / t["fast"]
        out[f"apply_m2po_ref_ms_{regime}_masked"] = 1e3 * t["ref_e2e"]
        out[f"apply_m2po_ms_{regime}_masked"] = 1e3 * t["fast_e2e"]
        out[f"apply_m2po_speedup_{regime}_masked"] = t["ref_e2e"] / t["fast_e2e"]
    return out


def _bench_update(repeats: int) -> dict[str, float]:
    """One PPO update step of a tiny Llama (hidden 256, 4 layers, vocab 1000, batch 16x256):
    forward + chunked log-probs + M2PO mask + PPO loss + backward + AdamW step, vs the M2PO
    mask of the same micro-batch and of the 64x4096 batch above."""
    from transformers import LlamaConfig, LlamaForCausalLM

    g = torch.Generator().manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = LlamaForCausalLM(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    bsz, seqlen = 16, 256
    input_ids = torch.randint(0, cfg.vocab_size, (bsz, seqlen), generator=g)
    loss_mask = torch.zeros(bsz, seqlen, dtype=torch.bool)
    loss_mask[:, 64:-1] = True  # prompt 64 tokens, completion up to the last label
    labels = torch.roll(input_ids, -1, dims=1)
    old = -torch.rand(bsz, seqlen, generator=g) * 4.0
    log_abs = torch.randn(bsz, seqlen, generator=g) * 1.5 - 2.5
    prox = old + torch.exp(log_abs)
    adv = torch.randn(bsz, seqlen, generator=g)
    m2 = ((old - prox)[loss_mask]) ** 2
    srt, _ = torch.sort(m2)
    thr = float(srt[: srt.numel() // 2].double().mean())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=input_ids).logits
        logp, _ = gather_logprobs_entropy(logits, labels, chunk_size=1024)
        keep = apply_m2po_masking(old, prox, loss_mask, thr)
        loss, _ = ppo_actor_loss_fn(
            logp, prox, old, adv, 0.2, loss_mask, c_clip=3.0, m2po_mask=keep
        )
        loss.backward()
        opt.step()

    d = _make_inputs(torch.Generator().manual_seed(0))
    t = _median_times(
        {
            "update": step,
            "m2po_mb": lambda: apply_m2po_masking(old, prox, loss_mask, thr),
            "m2po_big": lambda: apply_m2po_masking(
                d["old"], d["prox_half"], d["mask"], d["thr_half"]
            ),
        },
        max(3, repeats // 4),
    )
    return {
        "update_step_ms": 1e3 * t["update"],
        "m2po_microbatch_ms": 1e3 * t["m2po_mb"],
        "m2po_fraction_of_update": t["m2po_mb"] / t["update"],
        "m2po_64x4096_fraction_of_update": t["m2po_big"] / t["update"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--skip-update", action="store_true", help="skip the tiny-Llama step")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = _bench_m2po(args.repeats)
    if not args.skip_update:
        results.update(_bench_update(args.repeats))
    print(
        f"# torch {torch.__version__}, threads={torch.get_num_threads()}, [{B}, {T}] "
        f"{VALID_FRAC:.0%} valid, repeats={args.repeats} (median, interleaved)"
    )
    for k, v in results.items():
        print(f"{k}={v:.4g}")


if __name__ == "__main__":
    main()
