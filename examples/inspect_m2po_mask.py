"""Inspect the M2PO mask on a toy batch: which tokens go, and why.

Two sequences of eight generated tokens get random behaviour log-probs (``behave_logp``, what the
rollout policy recorded) and proximal log-probs (``prox_logp``, the policy at the start of the
training step) that drift from them, a few tokens drifting a lot. ``_apply_m2po_masking`` (the
AReaL-compatible helper) filters the full loss mask at ``m2_threshold=0.05``; the script prints
the token counts before and after, and replays the rule step by step: tokens are taken in order
of decreasing ``m2 = (behave_logp - prox_logp)^2`` and each one is dropped while the mean m2 of the
tokens still in (itself included) is at or above the threshold.

    python examples/inspect_m2po_mask.py
    python examples/inspect_m2po_mask.py --seed 3 --threshold 0.02
    python examples/inspect_m2po_mask.py --json        # the same facts as one JSON object

No model and no data: it runs in a second on a CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking, _get_m2po_loss_mask


def toy_logprobs(seed: int, shape: tuple[int, int] = (2, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ``(behave_logp, prox_logp)``: most tokens drift a little, about one in four a lot."""
    gen = torch.Generator().manual_seed(seed)
    behave_logp = -4.0 * torch.rand(shape, generator=gen)
    drift = 0.12 * torch.randn(shape, generator=gen)
    outlier = torch.rand(shape, generator=gen) < 0.25
    drift = torch.where(outlier, drift * 5.0, drift)
    prox_logp = (behave_logp + drift).clamp(max=0.0)
    return behave_logp, prox_logp


def explain(
    behave_logp: torch.Tensor, prox_logp: torch.Tensor, loss_mask: torch.Tensor, threshold: float
) -> dict[str, Any]:
    """Replay the M2PO rule on the valid tokens and record why each one was dropped or kept.

    The order is the library's: m2 descending, ties broken by the earlier position (row-major).
    "Running mean" is the mean m2 of the tokens still in the loss just before a decision.
    """
    d = behave_logp.double() - prox_logp.double()  # the library's m2 is float64
    m2 = (d * d)[loss_mask]
    positions = loss_mask.nonzero().tolist()  # row-major, aligned with m2
    sorted_m2, order = torch.sort(m2, descending=True, stable=True)
    values = sorted_m2.double()
    n = values.numel()
    suffix_mean = values.flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=torch.float64)
    steps: list[dict[str, Any]] = []
    n_drop = 0
    while n_drop < n - 1 and float(suffix_mean[n_drop]) >= threshold:
        row, col = positions[int(order[n_drop])]
        steps.append(
            {
                "row": row,
                "col": col,
                "m2": float(values[n_drop]),
                "running_mean": float(suffix_mean[n_drop]),
                "tokens_in": n - n_drop,
            }
        )
        n_drop += 1
    keep_sorted = torch.zeros(n, dtype=torch.bool)
    keep_sorted[n_drop:] = True
    keep = torch.zeros_like(loss_mask)
    keep[loss_mask] = torch.empty_like(keep_sorted).scatter_(0, order, keep_sorted)
    final_mean = float(values[n_drop:].mean()) if n else 0.0
    return {
        "m2": (d * d).tolist(),
        "steps": steps,
        "keep": keep,
        "final_mean": final_mean,
        "stopped_below": n == 0 or final_mean < threshold,
        "areal_helper_keep_sorted": _get_m2po_loss_mask(sorted_m2, threshold),
        "keep_sorted": keep_sorted,
    }


def _grid(mask: torch.Tensor) -> list[str]:
    rows = mask.tolist()
    return [f"  row {r}: " + " ".join("K" if k else "." for k in row) for r, row in enumerate(rows)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the toy log-probs")
    parser.add_argument("--threshold", type=float, default=0.05, help="m2_threshold")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    args = parser.parse_args(argv)

    behave_logp, prox_logp = toy_logprobs(args.seed)
    loss_mask = torch.ones_like(behave_logp, dtype=torch.bool)  # every token counts
    keep = _apply_m2po_masking(behave_logp, prox_logp, loss_mask, m2_threshold=args.threshold)
    why = explain(behave_logp, prox_logp, loss_mask, args.threshold)
    agrees = bool(torch.equal(keep, why["keep"])) and bool(
        torch.equal(why["areal_helper_keep_sorted"], why["keep_sorted"])
    )
    masked = (loss_mask & ~keep).nonzero().tolist()
    result: dict[str, Any] = {
        "threshold": args.threshold,
        "original_tokens": int(loss_mask.sum()),
        "filtered_tokens": int(keep.sum()),
        "masked_positions": [tuple(p) for p in masked],
        "steps": why["steps"],
        "mean_m2_before": float(torch.tensor(why["m2"]).double()[loss_mask].mean()),
        "mean_m2_after": why["final_mean"],
        "agrees_with_library": agrees,
    }
    if args.json:
        printable = dict(result, masked_positions=[list(p) for p in masked])
        print(json.dumps(printable, indent=2))
        return result

    print(f"m2_threshold = {args.threshold}   (seed {args.seed}, shape {tuple(loss_mask.shape)})")
    print()
    print("m2 = (behave_logp - prox_logp)^2 per token:")
    for r, row in enumerate(why["m2"]):
        print(f"  row {r}: " + " ".join(f"{v:7.4f}" for v in row))
    print()
    print(f"original token count (loss_mask):        {result['original_tokens']}")
    print(f"filtered token count (after M2PO):       {result['filtered_tokens']}")
    print(
        f"mean m2 before / after:                  "
        f"{result['mean_m2_before']:.4f} / {result['mean_m2_after']:.4f}"
    )
    print()
    print("kept (K) and masked (.) positions:")
    print("\n".join(_grid(keep)))
    print()
    if why["steps"]:
        print("why: tokens in order of decreasing m2; the running mean is the mean m2 of the")
        print("tokens still in the loss (this one included) when the token was considered")
        for i, s in enumerate(why["steps"], 1):
            print(
                f"  {i}. masked (row {s['row']}, col {s['col']}): m2 = {s['m2']:.4f}; running mean "
                f"of the {s['tokens_in']} tokens in = {s['running_mean']:.4f} >= {args.threshold}"
            )
    else:
        print("why: nothing masked")
    n_left = result["filtered_tokens"]
    if why["stopped_below"]:
        print(
            f"  stop: running mean of the {n_left} tokens left = {why['final_mean']:.4f} "
            f"< {args.threshold}; they all stay"
        )
    else:
        print(
            f"  stop: only {n_left} token left (its m2 {why['final_mean']:.4f} is still >= "
            f"{args.threshold}); M2PO always keeps at least one"
        )
    print()
    print(f"replay agrees with _apply_m2po_masking and _get_m2po_loss_mask: {agrees}")
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["agrees_with_library"] else 1)
