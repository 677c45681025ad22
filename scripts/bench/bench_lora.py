"""LoRA against full fine-tuning: training-state bytes, peak memory and time of an update.

    python scripts/bench/bench_lora.py               # SmolLM2-135M's shape: the docs' figures
    python scripts/bench/bench_lora.py --shape tiny  # the tiny built-in model (seconds)

Each mode runs in its own process (so one's freed memory does not hide in the other's
resident set), one after the other, on the same model shape (random weights from the
configuration of ``builtin:smollm2-135m-instruct`` or ``builtin:tiny``, seeded) and the same
batch: one warm-up update through ``HFTrainEngine.train_batch`` (AdamW state created), then
``--steps`` timed updates with the SFT loss. LoRA: rank ``--rank`` (alpha 2 x rank) on every
linear layer except the output head, as ``lora.target_modules: null``. Printed as
``name=value`` lines:

* ``lora_state_bytes_ratio``: bytes of the trainable parameters + their gradients + AdamW
  state (exact tensor sizes; gradients counted at the size of the trainable parameters, as
  they exist during the update) with LoRA over full fine-tuning. The frozen base weights are
  not training state; they are in the peak.
* ``lora_peak_mem_ratio``: peak resident memory during the timed updates, above the process's
  resident memory before the model was built (sampled every 2 ms from ``/proc/self/statm``;
  freed heap returned with ``malloc_trim`` and blocks of 1 MiB or more always mmapped), LoRA
  over full. This includes the weights themselves, the activations and the logits.
* ``lora_step_time_ratio``: mean update time, LoRA over full.

Threads are fixed (``--threads``, default 1). Memory is CPU RSS, not a GPU allocator's peak.
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
SHAPES = {"smollm2": "builtin:smollm2-135m-instruct", "tiny": "builtin:tiny"}


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


def _model(shape: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from areal_m2po.engine.builtin_models import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(SHAPES[shape]))
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _batch(args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (args.batch, args.seq), generator=g)
    loss_mask = torch.zeros_like(ids, dtype=torch.bool)
    loss_mask[:, args.seq // 2 :] = True
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids, dtype=torch.bool),
        "loss_mask": loss_mask,
    }


def state_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """Bytes of the trainable parameters, of their gradients (as large as they are) and of the
    optimizer state (a tied parameter counted once)."""
    import torch

    trainable = list({id(p): p for p in model.parameters() if p.requires_grad}.values())
    params = sum(p.numel() * p.element_size() for p in trainable)
    opt = sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if torch.is_tensor(v)
    )
    return {"params": params, "grads": params, "optimizer": opt}


def worker(mode: str, out_path: str, args: argparse.Namespace) -> None:
    """One mode (``full`` or ``lora``) in this process; writes its figures to ``out_path``."""
    import torch
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import (
        LoRAConfig,
        MicroBatchSpec,
        OptimizerConfig,
        TrainEngineConfig,
    )
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.trainer.sft_trainer import sft_loss_weight, sft_microbatch_loss

    torch.set_num_threads(args.threads)
    accelerator = Accelerator(cpu=True)
    _trim()
    base = _rss_bytes()
    lora = LoRAConfig(r=args.rank, alpha=2.0 * args.rank) if mode == "lora" else None
    cfg = TrainEngineConfig(
        path="bench",
        optimizer=OptimizerConfig(type="adamw", lr=1e-5, gradient_clipping=1.0),
        mb_spec=MicroBatchSpec(packing=False),
        lora=lora,
    )
    model = _model(args.shape)
    n_params = sum(p.numel() for p in model.parameters())
    engine = HFTrainEngine(cfg, accelerator, total_steps=10_000, model=model)
    batch = _batch(args, int(model.config.vocab_size))
    del model
    engine.train_batch(batch, sft_microbatch_loss, sft_loss_weight)  # warm-up: AdamW state exists
    state = state_bytes(engine.unwrapped, engine.optimizer)
    _trim()
    times = []
    with _PeakSampler() as sampler:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            engine.train_batch(batch, sft_microbatch_loss, sft_loss_weight)
            times.append(time.perf_counter() - t0)
    result = {
        "n_params": n_params,
        "n_trainable": state["params"] // 4,
        "state": state,
        "state_bytes": sum(state.values()),
        "peak_above_base": sampler.peak - base,
        "step_s": sum(times) / len(times),
    }
    with open(out_path, "w") as fh:
        json.dump(result, fh)
    accelerator.end_training()


def _launch(mode: str, out_path: str, argv: list[str]) -> None:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode, "--out", out_path, *argv]
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_=str(2**20))
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def figures(full: dict[str, Any], lora: dict[str, Any]) -> dict[str, float]:
    """The three ratios (LoRA over full) and the absolute figures behind them."""
    return {
        "lora_state_bytes_ratio": lora["state_bytes"] / full["state_bytes"],
        "lora_peak_mem_ratio": lora["peak_above_base"] / full["peak_above_base"],
        "lora_step_time_ratio": lora["step_s"] / full["step_s"],
        "lora_trainable_fraction": lora["n_trainable"] / full["n_params"],
        "full_state_mib": full["state_bytes"] / 2**20,
        "lora_state_mib": lora["state_bytes"] / 2**20,
        "full_peak_mib": full["peak_above_base"] / 2**20,
        "lora_peak_mib": lora["peak_above_base"] / 2**20,
        "full_step_s": full["step_s"],
        "lora_step_s": lora["step_s"],
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2", help="model shape")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank")
    p.add_argument("--seq", type=int, default=128, help="tokens per sequence")
    p.add_argument("--batch", type=int, default=4, help="sequences per update")
    p.add_argument("--steps", type=int, default=2, help="timed updates")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--worker", choices=("full", "lora"), help=argparse.SUPPRESS)
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
        for mode in ("full", "lora"):
            path = os.path.join(tmp, f"{mode}.json")
            _launch(mode, path, raw)
            with open(path) as fh:
                results[mode] = json.load(fh)
    out = figures(results["full"], results["lora"])
    print(f"model_params={results['full']['n_params']}")
    print(f"lora_trainable_params={results['lora']['n_trainable']}")
    for key, value in out.items():
        print(f"{key}={value:.4g}")
    return out


if __name__ == "__main__":
    main()
