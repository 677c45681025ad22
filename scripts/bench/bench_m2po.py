"""The M2PO mask's cost: against a plain sort-based mask, and as a share of a PPO update.

Run: ``python scripts/bench/bench_m2po.py [--rows 512] [--cols 8192] [--size 1m] [--device cpu]``

* ``vs_plain@REGIME``: ``_apply_m2po_masking`` (the module's rule with its input checks) over a
  plain sort-based mask with no checks (float64 m2 of the valid tokens, one sort, suffix means
  by a flipped cumulative sum, the first suffix below the threshold, one scatter), both on the
  same ``[--plain-rows, --plain-cols]`` inputs (default 64 x 4096), timed alternately in one
  loop, medians of ``--repeats``; ``stats_vs_plain@REGIME`` the same for ``m2po_mask`` (the
  mask and its statistics). Below 1: faster than the plain mask.

* ``mask_ms@REGIME``: ``m2po_mask`` (the mask and its stats: what one M2PO scope computes) on
  ``[rows, cols]`` float32 log-probs, completion lengths uniform in ``[cols/4, cols]``, median
  of ``--repeats``. Regimes: ``quiet`` (drift N(0, 0.1^2), threshold 0.04: nothing to mask),
  ``stale`` (heavy-tailed drift, threshold 0.04: about 13% masked),
  ``on_mean`` (m2 on a 0.05 grid, many equal values, threshold the float64 mean of the
  smallest 80%: a cut that float64 rounding decides).
* ``update_ms_per_1k_tokens``: one bare PPO step (forward, token log-probs, policy-gradient loss,
  backward, AdamW) of the bench's ``--size`` Llama on ``[--update-rows, --update-cols]`` tokens.
  Scaled linearly to ``rows x cols`` tokens: a LOWER bound on the update at that size (attention
  grows faster than linearly in the length, and the real update adds the loss statistics,
  entropy, clipping), so ``m2po_share@REGIME = mask / (mask + update)`` is an upper bound.

Everything runs in one process with ``--threads`` threads; the last lines are ``name=value``.
"""

from __future__ import annotations

import argparse
import functools
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
from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking  # noqa: E402

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


def plain_sort_mask(
    old: torch.Tensor, prox: torch.Tensor, mask: torch.Tensor, thr: float
) -> torch.Tensor:
    """The rule with nothing else: no input checks, no stable tie order, no statistics."""
    d = old[mask].double() - prox[mask].double()
    desc, order = torch.sort(d * d, descending=True)
    n = desc.numel()
    counts = torch.arange(n, 0, -1, dtype=torch.float64, device=desc.device)
    below = torch.nonzero(desc.flip(0).cumsum(0).flip(0) / counts < thr)
    n_drop = int(below[0, 0]) if below.numel() else n - 1
    keep_sorted = torch.arange(n, device=desc.device) >= n_drop
    out = torch.zeros_like(mask)
    out[mask] = torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted)
    return out


def bench_vs_plain(args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    """Medians of the module's mask, its mask + stats and the plain mask, timed alternately."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    out: dict[str, float] = {}
    for regime in ("quiet", "stale", "on_mean"):
        g = torch.Generator().manual_seed(0)
        inputs = mask_inputs(args.plain_rows, args.plain_cols, regime, g)
        old, prox, mask, thr = [x.to(device) for x in inputs[:3]] + [inputs[3]]
        fns = {
            "plain": functools.partial(plain_sort_mask, old, prox, mask, thr),
            "apply": functools.partial(_apply_m2po_masking, old, prox, mask, thr),
            "stats": functools.partial(m2po_mask, old, prox, mask, thr),
        }
        # as many tokens kept (which of several equal m2 values go differs: unstable sort)
        assert int(fns["plain"]().sum()) == int(fns["apply"]().sum()), regime
        times: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.repeats):
            for name, fn in fns.items():
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        out[f"plain_ms@{regime}"] = 1e3 * med["plain"]
        out[f"vs_plain@{regime}"] = med["apply"] / med["plain"]
        out[f"stats_vs_plain@{regime}"] = med["stats"] / med["plain"]
    return out


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
    parser.add_argument("--plain-rows", type=int, default=64)
    parser.add_argument("--plain-cols", type=int, default=4096)
    parser.add_argument("--update-rows", type=int, default=8)
    parser.add_argument("--update-cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    res = bench_vs_plain(args, device)
    res.update(bench_mask(args, device))
    res.update(bench_update(args, device))
    update_ms = res["update_ms_per_1k_tokens"] * args.rows * args.cols / 1e3
    res["update_ms_lower_bound"] = update_ms
    for regime in ("quiet", "stale", "on_mean"):
        mask_ms = res[f"mask_ms@{regime}"]
        res[f"m2po_share@{regime}"] = mask_ms / (mask_ms + update_ms)
    print(
        f"# torch {torch.__version__}, {device}, threads={torch.get_num_threads()}, "
        f"vs_plain on [{args.plain_rows}, {args.plain_cols}], mask on "
        f"[{args.rows}, {args.cols}], update of the {args.size} Llama on "
        f"[{args.update_rows}, {args.update_cols}] scaled to [{args.rows}, {args.cols}]"
    )
    for k, v in res.items():
        print(f"{k}={v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
