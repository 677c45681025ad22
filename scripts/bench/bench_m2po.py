"""The M2PO mask's share of a PPO update at a realistic size (issue 12: one rule unless > 1%).

Run: ``python scripts/bench/bench_m2po.py [--rows 512] [--cols 8192] [--size 1m] [--device cpu]``

* ``mask_ms@REGIME``: ``m2po_mask`` (the mask and its stats: what one M2PO scope computes) on
  ``[rows, cols]`` float32 log-probs, completion lengths uniform in ``[cols/4, cols]``, median
  of ``--repeats``. Regimes: ``quiet`` (drift N(0, 0.1^2), threshold 0.04: nothing to mask, one
  reduction), ``stale`` (heavy-tailed drift, threshold 0.04: the sort and the cumulative means),
  ``on_mean`` (m2 on a 0.05 grid, threshold the float64 mean of the smallest 80%: the exact
  evaluation of the cut runs too).
* ``update_ms_per_1k_tokens``: one bare PPO step (forward, token log-probs, policy-gradient loss,
  backward, AdamW) of the bench's ``--size`` Llama on ``[--update-rows, --update-cols]`` tokens.
  Scaled linearly to ``rows x cols`` tokens: a LOWER bound on the update at that size (attention
  grows faster than linearly in the length, and the real update adds the loss statistics,
  entropy, clipping), so ``m2po_share@REGIME = mask / (mask + update)`` is an upper bound.

Everything runs in one process with ``--threads`` threads; the last lines are ``name=value``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import build_model  # noqa: E402

from areal_m2po.algo.m2po import m2_per_token, m2po_mask  # noqa: E402

THRESHOLD = 0.04


def median_seconds(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall seconds of ``fn`` over ``repeats`` runs after one warm-up (device synced)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def mask_inputs(rows: int, cols: int, regime: str, g: torch.Generator) -> tuple:
    """(behaviour logp, proximal logp, loss_mask, threshold) float32/bool ``[rows, cols]``."""
    lengths = torch.randint(cols // 4, cols + 1, (rows, 1), generator=g)
    mask = torch.arange(cols)[None, :] < lengths
    old = -torch.rand(rows, cols, generator=g) * 4.0
    if regime == "quiet":
        drift = 0.1 * torch.randn(rows, cols, generator=g)
    elif regime == "stale":
        sign = torch.where(torch.rand(rows, cols, generator=g) < 0.5, -1.0, 1.0)
        drift = sign * torch.exp(torch.randn(rows, cols, generator=g) * 0.9 - 1.8)
    else:  # on_mean: m2 on a 0.05 grid (float64), threshold exactly a float64 prefix mean
        old = old.double()
        drift = torch.randint(0, 8, (rows, cols), generator=g).double().mul_(0.05).sqrt_()
    prox = old + drift
    thr = THRESHOLD
    if regime == "on_mean":
        asc = m2_per_token(old, prox, mask)[mask].sort().values
        k = int(0.8 * asc.numel())
        thr = float(asc[:k].sum()) / k
    return old, prox, mask, thr


def bench_mask(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    out: dict[str, float] = {}
    for regime in ("quiet", "stale", "on_mean"):
        old, prox, mask, thr = mask_inputs(
            args.rows, args.cols, regime, torch.Generator().manual_seed(0)
        )
        old, prox, mask = old.to(device), prox.to(device), mask.to(device)

        def step(old=old, prox=prox, mask=mask, thr=thr) -> dict[str, torch.Tensor]:
            return m2po_mask(old, prox, mask, thr)[1]

        stats = step()
        out[f"masked_fraction@{regime}"] = float(stats["m2po/masked_fraction"])
        out[f"mask_ms@{regime}"] = 1e3 * median_seconds(step, args.repeats, device)
    out["valid_tokens"] = float(mask.sum())
    return out


def bench_update(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as workdir:
        spec = build_model(args.size, Path(workdir))
    model = spec.model.to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, spec.vocab, (args.update_rows, args.update_cols), generator=g)
    adv = torch.randn(args.update_rows, args.update_cols - 1, generator=g)
    ids, adv = ids.to(device), adv.to(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits[:, :-1].float()
        logp = -torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), ids[:, 1:], reduction="none"
        )
        loss = -(adv * torch.exp(logp - logp.detach())).mean()
        loss.backward()
        opt.step()

    seconds = median_seconds(step, max(1, args.repeats // 2), device)
    return {
        "update_params_m": spec.n_params / 1e6,
        "update_ms_per_1k_tokens": 1e6 * seconds / ids.numel(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--cols", type=int, default=8192)
    parser.add_argument(
        "--size", default="1m", help="a size of scripts/bench/bench.py (1m, 10m, 135m)"
    )
    parser.add_argument("--update-rows", type=int, default=8)
    parser.add_argument("--update-cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    res = bench_mask(args, device)
    res.update(bench_update(args, device))
    update_ms = res["update_ms_per_1k_tokens"] * args.rows * args.cols / 1e3
    res["update_ms_lower_bound"] = update_ms
    for regime in ("quiet", "stale", "on_mean"):
        mask_ms = res[f"mask_ms@{regime}"]
        res[f"m2po_share@{regime}"] = mask_ms / (mask_ms + update_ms)
    print(
        f"# torch {torch.__version__}, {device}, threads={torch.get_num_threads()}, mask on "
        f"[{args.rows}, {args.cols}], update of the {args.size} Llama on "
        f"[{args.update_rows}, {args.update_cols}] scaled to [{args.rows}, {args.cols}]"
    )
    for k, v in res.items():
        print(f"{k}={v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
