"""Side-by-side performance figures of the trainer, every one a ratio measured in one run.

Run::

    python scripts/bench/bench.py                      # --sizes 1m,10m --threads 1, ~4 minutes
    python scripts/bench/bench.py --sizes smollm2 --repeats 3                    # ~20 minutes
    python scripts/bench/bench.py --device cuda --amp bf16 --sizes 10m,135m     # on a GPU

Update timings are this process's CPU time on a CPU (``--clock``), wall time on a GPU.

The figures live in ``scripts/bench/benchlib/`` (``update_step``, ``logprob_memory``, ``rl_step``)
and share one harness (``benchlib/harness.py``: process set-up, clock, interleaved rounds,
medians of per-round ratios); the trainer is timed through its step callbacks, never patched.

For each model size it measures, with interleaved repeats (ours, bare, packed, matmul, ours, ...)
and medians, so that the shared CPU's swings hit every contender alike:

* ``overhead_ratio``: one PPO update step through ``PPOActor.ppo_update`` ->
  ``HFTrainEngine.train_batch`` (M2PO on, global scope, clipped PPO loss, entropy and stats,
  gradient clipping, AdamW), over a bare PyTorch step on an identical model: the same tokens and
  micro-batches (``split_microbatches``), padding columns trimmed, ``logits_to_keep``,
  ``cross_entropy`` log-probs, a policy-gradient loss, backward, ``AdamW.step``.
* ``packed_speedup``: the same update with ``mb_spec.packing=true`` (time padded / packed).
* ``m2po_fraction_of_update``: time inside the M2PO mask (``global_m2po_mask`` and, for the
  micro-batch scope, ``m2po.m2po_mask``) over the update step.
* ``rl_step_breakdown``: ``RLTrainer.train`` for a few steps (staleness 1 so the proximal
  log-probs are recomputed, ``kl_ctl`` > 0 so the reference model runs): generation (incl.
  reward) / log-prob recompute / ref / update / other, in % of the summed wall time of the
  steps after the first, and completion tokens per second. The trainer runs with its defaults
  (packing on, one micro-batch).
* ``logprob_peak_mem_ratio``: peak memory allocated while computing per-token log-probs and
  entropies (forward, then forward + backward) over the size of the logits tensor, for the
  engine's chunked path and a full ``log_softmax`` path. CPU: the profiler's allocator events
  (``torch.profiler`` with ``profile_memory``); GPU: ``torch.cuda.max_memory_allocated``.
* ``mfu``: model FLOPs of the default (packed) update step (6 x matmul parameters x real
  tokens, causal attention, the LM head on the scored positions only; padding not counted) per
  second, over a float32 (bf16 with ``--amp bf16``) matmul throughput measured between the same
  repeats (``mfu_padded``: the padded update).

``overhead_ratio`` compares like with like (both padded); ``default_update_vs_bare`` is the
default update (packed) over the bare padded step.

The last lines are ``name=value``, one per figure (``name@size`` per model size, the plain name
for the largest size run).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, also under runpy
try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib.harness import Clock, rounded, setup_process  # noqa: E402
from benchlib.logprob_memory import logprob_memory  # noqa: E402
from benchlib.models import build_model, synthetic_batch  # noqa: E402
from benchlib.rl_step import rl_breakdown  # noqa: E402
from benchlib.update_step import time_update  # noqa: E402

from areal_m2po.api.cli_args import MicroBatchSpec  # noqa: E402
from areal_m2po.utils.data import split_microbatches  # noqa: E402

log = logging.getLogger("bench")


def bench_size(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from accelerate import Accelerator

    device = torch.device(args.device)
    clock = Clock(device, args.clock)
    spec = build_model(name, workdir)
    max_new = args.max_new_tokens
    batch = synthetic_batch(spec, args.prompts, args.samples, max_new)
    mb_spec = MicroBatchSpec(n_mbs=args.n_mbs, max_tokens_per_mb=args.max_tokens_per_mb)
    n_mbs = len(split_microbatches(batch, mb_spec.n_mbs, mb_spec.max_tokens_per_mb))
    accelerator = Accelerator(
        cpu=device.type == "cpu", mixed_precision="bf16" if args.amp == "bf16" else "no"
    )
    res: dict[str, Any] = {
        "size": name,
        "params_m": spec.n_params / 1e6,
        "sequences": int(batch["input_ids"].shape[0]),
        "real_tokens": int(batch["attention_mask"].sum()),
        "scored_tokens": int(batch["loss_mask"].sum()),
        "micro_batches": n_mbs,
    }
    log.info("[%s] %.2fM params, %s", name, res["params_m"], json.dumps(res))

    res.update(time_update(spec, batch, mb_spec, accelerator, clock, args))
    log.info("[%s] update: %s", name, json.dumps({k: rounded(v) for k, v in res.items()}))
    gc.collect()

    # log-prob memory at this model's vocabulary, on the scored rows of the batch (at least 1k)
    mem_rows = max(int(batch["loss_mask"].sum()) + args.prompts * args.samples, 1024)
    mem = logprob_memory(mem_rows, spec.vocab, device, torch.float32)
    res.update({f"mem_{k}": v for k, v in mem.items()})
    res["logprob_peak_mem_ratio"] = max(mem["ours_fwd"], mem["ours_train"])
    log.info("[%s] memory: %s", name, json.dumps({k: rounded(v) for k, v in mem.items()}))

    if args.rl_steps > 0:
        rl = rl_breakdown(spec, args.rl_steps, args.threads, args.prompts, args.samples, 16)
        res.update({f"rl_{k}": v for k, v in rl.items()})
        log.info("[%s] rl step: %s", name, json.dumps({k: rounded(v) for k, v in rl.items()}))
    return res


def final_lines(results: list[dict[str, Any]], mem: dict[str, float]) -> list[str]:
    lines: list[str] = []
    for res in results:
        s = res["size"]
        lines += [
            f"overhead_ratio@{s}={res['overhead_ratio']:.3f}",
            f"packed_speedup@{s}={res['packed_speedup']:.3f}",
            f"default_update_vs_bare@{s}={res['overhead_ratio'] / res['packed_speedup']:.3f}",
            f"m2po_fraction_of_update@{s}={res['m2po_fraction_of_update']:.4f}",
            f"logprob_peak_mem_ratio@{s}={res['logprob_peak_mem_ratio']:.3f}",
            f"mfu@{s}={res['mfu_packed']:.3f}",
            f"mfu_padded@{s}={res['mfu']:.3f}",
        ]
        if "rl_step_s" in res:
            lines.append(f"rl_step_breakdown@{s}={_breakdown(res)}")
    last = results[-1]
    lines += [
        f"overhead_ratio={last['overhead_ratio']:.3f}",
        f"m2po_fraction_of_update={last['m2po_fraction_of_update']:.4f}",
        f"logprob_peak_mem_ratio@vocab{int(mem['vocab'])}="
        f"{max(mem['ours_fwd'], mem['ours_train']):.3f}",
        "logprob_peak_mem_ratio="
        + format(
            max(
                [mem["ours_fwd"], mem["ours_train"]]
                + [r["logprob_peak_mem_ratio"] for r in results]
            ),
            ".3f",
        ),
        f"mfu={last['mfu_packed']:.3f}",
    ]
    if "rl_step_s" in last:
        lines.append(f"rl_step_breakdown={_breakdown(last)}")
    return lines


def _breakdown(res: dict[str, Any]) -> str:
    return (
        f"gen:{res['rl_gen_pct']:.1f}%,logprob:{res['rl_logprob_pct']:.1f}%,"
        f"ref:{res['rl_ref_pct']:.1f}%,update:{res['rl_update_pct']:.1f}%,"
        f"other:{res['rl_other_pct']:.1f}%,completion_tok_per_s:{res['rl_completion_tok_per_s']:.1f}"
    )


def table(results: list[dict[str, Any]]) -> str:
    cols = [
        ("size", "size", "{}"),
        ("params_m", "params (M)", "{:.2f}"),
        ("micro_batches", "mbs", "{}"),
        ("ours_s", "ours (s)", "{:.3f}"),
        ("bare_s", "bare (s)", "{:.3f}"),
        ("packed_s", "packed (s)", "{:.3f}"),
        ("overhead_ratio", "overhead", "{:.3f}"),
        ("packed_speedup", "pack speedup", "{:.3f}"),
        ("m2po_fraction_of_update", "m2po frac", "{:.4f}"),
        ("mem_ours_fwd", "mem fwd", "{:.2f}"),
        ("mem_ours_train", "mem train", "{:.2f}"),
        ("mem_full_fwd", "full fwd", "{:.2f}"),
        ("mem_full_train", "full train", "{:.2f}"),
        ("mfu", "mfu", "{:.3f}"),
        ("mfu_packed", "mfu packed", "{:.3f}"),
        ("mfu_bare", "mfu bare", "{:.3f}"),
        ("matmul_peak_gflops", "peak GF/s", "{:.1f}"),
    ]
    head = "| " + " | ".join(c[1] for c in cols) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    rows = [
        "| " + " | ".join(fmt.format(r[k]) if k in r else "-" for k, _, fmt in cols) + " |"
        for r in results
    ]
    return "\n".join([head, sep, *rows])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes",
        default="1m,10m",
        help="comma list of 1m, 10m, 135m (SmolLM2's shape, random weights), smollm2 (real)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (1: on a shared CPU, 2+ threads spin-wait for each other "
        "whenever another job holds a core, which swamps the ratios)",
    )
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (median)")
    p.add_argument(
        "--rl-steps", type=int, default=5, help="RLTrainer steps, >= 3 (0: skip the RL step)"
    )
    p.add_argument("--prompts", type=int, default=8, help="prompts per batch")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=32, help="update batch completions")
    p.add_argument("--n-mbs", type=int, default=1)
    p.add_argument("--max-tokens-per-mb", type=int, default=1024)
    p.add_argument("--m2-scope", default="global", choices=("global", "microbatch"))
    p.add_argument("--matmul-n", type=int, default=1024, help="matmul probe size")
    p.add_argument("--mem-vocab", type=int, default=49152, help="vocabulary of the memory probe")
    p.add_argument("--mem-rows", type=int, default=1088, help="logits rows of the memory probe")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto")
    p.add_argument("--amp", default="none", choices=("none", "bf16"))
    p.add_argument(
        "--clock",
        default="auto",
        choices=("auto", "wall", "cpu"),
        help="what the update timings measure (auto: process CPU time on CPU, wall on GPU)",
    )
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.clock == "auto":
        args.clock = "cpu" if args.device == "cpu" else "wall"
    setup_process(args.threads, args.amp)
    log.info("torch %s, %s, %d threads, %s", torch.__version__, args.device, args.threads, args.amp)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
            results.append(bench_size(size, args, Path(tmp)))
    # the log-prob memory at a real vocabulary (SmolLM2's), whatever the model sizes run:
    # the scored positions of a 64 x 16-token GRPO batch plus one per sequence
    mem = logprob_memory(args.mem_rows, args.mem_vocab, torch.device(args.device), torch.float32)
    log.info(
        "memory at vocab %d: %s",
        args.mem_vocab,
        json.dumps({k: rounded(v) for k, v in mem.items()}),
    )
    print(table(results))
    print(
        f"log-prob memory, {args.mem_rows} x {args.mem_vocab} fp32 logits "
        f"({mem['logits_mb']:.0f} MiB), peak extra / logits: engine {mem['ours_fwd']:.2f} "
        f"(no grad), {mem['ours_train']:.2f} (with backward); full log_softmax "
        f"{mem['full_fwd']:.2f}, {mem['full_train']:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({"sizes": results, "memory": mem}, indent=1))
    for line in final_lines(results, mem):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
