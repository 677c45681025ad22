"""FSDP2 against DDP on 2 processes: per-rank state bytes, peak memory and step time.

    python scripts/bench/bench_fsdp.py                       # the figures in docs/performance.md
    python scripts/bench/bench_fsdp.py --hidden 64 --layers 2 --vocab 512 --seq 16 --steps 1  # toy

Each backend runs in its own ``accelerate launch --multi_gpu --num_processes 2`` (gloo on this
CPU), one after the other, on the same seeded random Llama and the same batch: one warm-up
update (AdamW state created), then ``--steps`` timed updates through ``HFTrainEngine.train_batch``.
Printed, as ``name=value`` lines:

* ``fsdp_state_bytes_ratio``: per-rank bytes of parameters + gradients + AdamW state with FSDP2
  over DDP (exact tensor sizes; gradients counted at the size of the trainable local parameters,
  as they exist during the update). Ideal 0.5 on 2 processes.
* ``fsdp_peak_mem_ratio``: per-rank peak resident memory during the timed updates, above the
  process's resident memory before the model was built (sampled every 2 ms from
  ``/proc/self/statm``; freed heap returned with ``malloc_trim`` first, and blocks of 1 MiB or
  more always mmapped so freed buffers leave the resident set), FSDP2 over DDP; the larger of
  the two ranks for each.
* ``fsdp_step_time_ratio``: mean update time (slowest rank) FSDP2 over DDP. On a shared CPU this
  is communication (gloo all-gathers and reduce-scatters) against compute; no goal here.

Memory is RSS on CPU, not a GPU allocator's peak; the ratio is the meaningful figure.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim() -> None:
    """Give freed heap back to the OS so RSS reflects live memory (glibc; no-op elsewhere)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _PeakSampler:
    """Peak RSS over a block, sampled from a background thread."""

    def __init__(self, period_s: float = 0.002) -> None:
        self.period_s = period_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(self.period_s)

    def __enter__(self) -> _PeakSampler:
        self.peak = _rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())


def _model(args: argparse.Namespace) -> Any:
    from areal_m2po.engine.builtin_models import build_tiny_llama

    heads = max(args.hidden // 64, 1)
    return build_tiny_llama(
        args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2 * args.seq,
        tie_word_embeddings=False,
    )


def _batch(args: argparse.Namespace, rank: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(1 + rank)
    ids = torch.randint(1, args.vocab, (args.batch, args.seq), generator=g)
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, args.seq // 2 :] = True
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "loss_mask": loss_mask,
    }


def _loss(logp: Any, _ent: Any, mb: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    mask = mb["loss_mask"].float()
    loss = -(logp * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"nll": loss.detach()}


def worker(backend: str, out_path: str, args: argparse.Namespace) -> None:
    """One backend on this rank of an ``accelerate launch``; rank 0 writes ``out_path``."""
    import torch
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import MicroBatchSpec, OptimizerConfig, TrainEngineConfig
    from areal_m2po.engine import fsdp
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.utils import dist

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    _trim()
    base = _rss_bytes()
    cfg = TrainEngineConfig(
        path="bench",
        backend=backend,
        optimizer=OptimizerConfig(type="adamw", lr=1e-5, gradient_clipping=1.0),
        mb_spec=MicroBatchSpec(n_mbs=args.n_mbs, packing=False),
    )
    engine = HFTrainEngine(cfg, accelerator, total_steps=10_000, model=_model(args))
    batch = _batch(args, dist.rank())

    def weight(mb: dict[str, Any]) -> float:
        return float(mb["loss_mask"].sum())

    engine.train_batch(batch, _loss, weight)  # warm-up: AdamW state exists from here on
    state = fsdp.local_state_bytes(engine.model, engine.optimizer)
    # the gradients were freed by zero_grad; during an update they match the trainable params
    trainable = {id(p): p for p in engine.model.parameters() if p.requires_grad}
    state["grads"] = sum(fsdp.local_nbytes(p) for p in trainable.values())
    _trim()
    times = []
    with _PeakSampler() as sampler:
        for _ in range(args.steps):
            dist.barrier()
            t0 = time.perf_counter()
            engine.train_batch(batch, _loss, weight)
            times.append(time.perf_counter() - t0)
    mine = {
        "state_bytes": sum(state.values()),
        "state": state,
        "peak_above_base": sampler.peak - base,
        "step_s": sum(times) / len(times),
    }
    ranks: list[Any] = [None] * dist.world_size()
    torch.distributed.all_gather_object(ranks, mine)
    if accelerator.is_main_process:
        with open(out_path, "w") as fh:
            json.dump(ranks, fh)
    accelerator.wait_for_everyone()
    accelerator.end_training()


def _launch(backend: str, out_path: str, argv: list[str]) -> None:
    from areal_m2po.utils.dist import cpu_launch_command

    cmd = [
        *cpu_launch_command(2),
        os.path.abspath(__file__),
        "--worker",
        backend,
        "--out",
        out_path,
        *argv,
    ]
    # large blocks always mmapped (glibc's dynamic threshold off), so a freed gather buffer
    # leaves the resident set at once instead of staying in a fragmented heap
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_=str(2**20))
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{backend} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def figures(ddp: list[dict[str, Any]], sharded: list[dict[str, Any]]) -> dict[str, float]:
    """The three ratios from the per-rank results of both runs (worst rank of each)."""

    def worst(ranks: list[dict[str, Any]], key: str) -> float:
        return float(max(r[key] for r in ranks))

    return {
        "fsdp_state_bytes_ratio": worst(sharded, "state_bytes") / worst(ddp, "state_bytes"),
        "fsdp_peak_mem_ratio": worst(sharded, "peak_above_base") / worst(ddp, "peak_above_base"),
        "fsdp_step_time_ratio": worst(sharded, "step_s") / worst(ddp, "step_s"),
        "ddp_state_mib": worst(ddp, "state_bytes") / 2**20,
        "fsdp_state_mib": worst(sharded, "state_bytes") / 2**20,
        "ddp_peak_mib": worst(ddp, "peak_above_base") / 2**20,
        "fsdp_peak_mib": worst(sharded, "peak_above_base") / 2**20,
        "ddp_step_s": worst(ddp, "step_s"),
        "fsdp_step_s": worst(sharded, "step_s"),
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=512, help="hidden size")
    p.add_argument("--layers", type=int, default=8, help="decoder layers")
    p.add_argument("--vocab", type=int, default=8192, help="vocabulary size")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank")
    p.add_argument("--n-mbs", type=int, default=1, help="micro-batches per update")
    p.add_argument("--steps", type=int, default=3, help="timed updates")
    p.add_argument("--worker", choices=("ddp", "fsdp2"), help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> dict[str, float] | None:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(raw)
    if args.worker:
        worker(args.worker, args.out, args)
        return None
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("ddp", "fsdp2"):
            path = os.path.join(tmp, f"{backend}.json")
            _launch(backend, path, raw)
            with open(path) as fh:
                results[backend] = json.load(fh)
    out = figures(results["ddp"], results["fsdp2"])
    print(f"model_params={results['ddp'][0]['state']['params'] // 4}")
    for key, value in out.items():
        print(f"{key}={value:.4g}")
    return out


if __name__ == "__main__":
    main()
