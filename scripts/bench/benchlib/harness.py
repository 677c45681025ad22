"""What every benchmark figure shares: the process set-up (offline, one pinned thread count,
quiet loggers), a clock (wall or process CPU time, after a device sync), interleaved rounds,
medians of per-round ratios, a matmul throughput probe, a phase timer fed by the trainer's step
callbacks, and number formatting."""

from __future__ import annotations

import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from areal_m2po.api.callbacks import StepCallback

QUIET_RUN = (
    "evaluator.freq_steps=null",
    "evaluator.eval_at_start=false",
    "evaluator.eval_at_end=false",
    "saver.save_at_end=false",
    "stats_logger.jsonl=false",
    "stats_logger.console=false",
    "stats_logger.progress_bar=false",
)
"""Config overrides of a benchmarked training run: no evaluation, no saves, no logs."""


def setup_process(threads: int, amp: str) -> None:
    """Offline hub, one thread count for every torch op (pinned: on a shared CPU, 2+ threads
    spin-wait for each other whenever another job holds a core), one mixed-precision setting
    for every Accelerator of the process, INFO logs of the benchmark only."""
    for key, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("HF_DATASETS_OFFLINE", "1"),
        ("WANDB_MODE", "disabled"),
        ("TOKENIZERS_PARALLELISM", "false"),
    ):
        os.environ.setdefault(key, value)
    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16" if amp == "bf16" else "no"
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for noisy in ("areal_m2po", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


class Clock:
    """Wall-clock seconds, or this process's CPU seconds (all threads), after a device sync.

    On a shared CPU, wall time also counts the time other jobs hold the cores; process CPU time
    does not (it still counts cache and memory-bandwidth contention), so ratios of CPU time
    swing much less. On a GPU only wall time means anything.
    """

    def __init__(self, device: torch.device, kind: str = "wall") -> None:
        self.cuda = device.type == "cuda"
        self.kind = kind

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def now(self) -> float:
        self.sync()
        return time.process_time() if self.kind == "cpu" else time.perf_counter()


class PhaseTimer(StepCallback):
    """Seconds spent in the named phases (e.g. ``m2po``) on ``clock``, told by the trainer's
    and the actor's step callbacks (:class:`areal_m2po.api.callbacks.StepCallback`)."""

    def __init__(self, clock: Clock, names: Sequence[str]) -> None:
        self.clock = clock
        self.names = set(names)
        self.seconds = 0.0
        self.calls = 0
        self._started: list[float] = []

    def on_phase_begin(self, name: str) -> None:
        if name in self.names:
            self._started.append(self.clock.now())

    def on_phase_end(self, name: str, seconds: float) -> None:
        if name in self.names:
            self.seconds += self.clock.now() - self._started.pop()
            self.calls += 1


def interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, clock: Clock, warmup: int = 1
) -> dict[str, list[float]]:
    """Each round runs every fn once, in order; returns the seconds of every round."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = clock.now()
            fn()
            out[k].append(clock.now() - t0)
    return out


def matmul_probe(
    device: torch.device, dtype: torch.dtype, n: int
) -> tuple[Callable[[], Any], float]:
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def run() -> None:
        for _ in range(4):
            torch.mm(a, b)

    return run, 4 * 2.0 * n**3


def median_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of ``num[i] / den[i]`` (both timed in the same round)."""
    return statistics.median(n / d for n, d in zip(num, den))


def rounded(v: Any) -> Any:
    """Floats to 4 decimals for the logs."""
    return round(v, 4) if isinstance(v, float) else v
