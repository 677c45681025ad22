"""Where a training step's and an evaluation's time goes: ``torch.profiler`` (CPU) over one
``RLTrainer`` step and one held-out evaluation, by phase and by kind of op.

Run::

    python scripts/bench/profile_step.py                        # the main job, step 2, 2 threads
    python scripts/bench/profile_step.py --threads 1 --step 3 --steps 3
    python scripts/bench/profile_step.py --config configs/tiny.yaml   # seconds

It builds ``RLTrainer`` from ``--config`` (default ``configs/default.yaml``: the main job)
with the evaluation, saves and logs off, profiles one held-out evaluation of the initial
policy (``--no-eval``: none), then trains ``--steps`` steps and profiles step ``--step``
(staleness 1: from step 2 on, the proximal log-probs are recomputed). The trainer's phases
(``generate`` ... ``sync``, through its step callbacks) are marked with
``torch.profiler.record_function``; each op's self CPU time is charged to the phase it ran in
and to a kind of op (:data:`KINDS`: matrix products, attention, softmax, elementwise,
memory and indexing, optimizer, other). ``outside ops`` is the phase's time not spent inside
any torch op: Python, the tokenizer, the reward function.

The profiler adds a few microseconds per op, so small ops look dearer than they are; take the
shares, not the seconds. Extra ``key=value`` arguments override the config. The last lines are
``name=value``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchlib, also under runpy
try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib.harness import QUIET_RUN, setup_process  # noqa: E402
from torch._C._profiler import _ExperimentalConfig  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from areal_m2po.api.callbacks import StepCallback  # noqa: E402
from areal_m2po.api.config_loader import load_config  # noqa: E402

MARK = "phase::"
KINDS: dict[str, tuple[str, ...]] = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv"),
    "attention": ("scaled_dot_product", "flash_attention", "aten::_efficient_attention"),
    "softmax": ("softmax", "logsumexp", "aten::_log_softmax", "aten::log_softmax"),
    "optimizer": ("aten::_foreach", "aten::_fused_adam", "aten::lerp", "aten::addcdiv"),
    "memory": (
        "aten::copy_",
        "aten::cat",
        "aten::index",
        "aten::index_select",
        "aten::gather",
        "aten::scatter",
        "aten::masked_fill",
        "aten::fill_",
        "aten::zero_",
        "aten::clone",
        "aten::empty",
        "aten::contiguous",
        "aten::repeat_interleave",
        "aten::where",
        "aten::embedding",
        "aten::_to_copy",
        "aten::slice_scatter",
        "aten::nonzero",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::sort",
        "aten::argsort",
        "aten::isin",
    ),
    "elementwise": (
        "aten::add",
        "aten::mul",
        "aten::sub",
        "aten::div",
        "aten::silu",
        "aten::neg",
        "aten::pow",
        "aten::rsqrt",
        "aten::mean",
        "aten::exp",
        "aten::sum",
        "aten::max",
        "aten::min",
        "aten::clamp",
        "aten::abs",
        "aten::cumsum",
        "aten::eq",
        "aten::ne",
        "aten::gt",
        "aten::lt",
        "aten::ge",
        "aten::le",
        "aten::log",
        "aten::sqrt",
        "aten::sigmoid",
        "aten::logical",
        "aten::bitwise",
        "aten::any",
        "aten::all",
        "aten::argmax",
        "aten::multinomial",
        "aten::topk",
        "aten::norm",
        "aten::linalg_vector_norm",
        "aten::reciprocal",
        "aten::cos",
        "aten::sin",
        "aten::mse",
        "aten::tanh",
    ),
}
"""Kinds of op, by a prefix (or, for the first three, a part) of the profiler's op name."""


def cpu_profile() -> Any:
    """A CPU ``torch.profiler.profile`` that records every thread's ops (generation runs in
    a worker thread: ``asyncio.to_thread``)."""
    return profile(
        activities=[ProfilerActivity.CPU],
        experimental_config=_ExperimentalConfig(profile_all_threads=True),
    )


def op_kind(name: str) -> str:
    """The :data:`KINDS` key of a profiled op name (``other`` when none matches)."""
    for kind in ("matmul", "attention", "softmax"):
        if any(part in name for part in KINDS[kind]):
            return kind
    for kind in ("optimizer", "memory", "elementwise"):
        if any(name.startswith(prefix) for prefix in KINDS[kind]):
            return kind
    return "other"


class PhaseProfiler(StepCallback):
    """Profiles training step ``target`` (``torch.profiler``, CPU) and marks each trainer phase
    inside it with ``record_function("phase::<name>")``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.prof: Any = None
        self.result: Any = None
        self._marks: list[Any] = []

    def on_step_begin(self, step: int) -> None:
        if step == self.target:
            self.prof = cpu_profile()
            self.prof.__enter__()

    def on_phase_begin(self, name: str) -> None:
        if self.prof is not None:
            mark = record_function(MARK + name)
            mark.__enter__()
            self._marks.append(mark)

    def on_phase_end(self, name: str, seconds: float) -> None:
        if self.prof is not None and self._marks:
            self._marks.pop().__exit__(None, None, None)

    def on_step_end(self, step: int, stats: dict[str, float]) -> None:
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.result, self.prof = self.prof, None


def _phase_marks(events: list[Any]) -> list[tuple[float, float, str]]:
    """``(start µs, end µs, phase)`` of the outermost ``phase::`` marks, in time order (the
    actor's ``m2po`` counts in ``update``)."""
    marks = sorted(
        (e.time_range.start, e.time_range.end, e.name[len(MARK) :])
        for e in events
        if e.name.startswith(MARK)
    )
    outer: list[tuple[float, float, str]] = []
    for start, end, name in marks:
        if outer and start < outer[-1][1]:
            continue
        outer.append((start, end, name))
    return outer


def breakdown(events: list[Any], default: str) -> dict[str, Any]:
    """Seconds by phase and by kind of op within each phase, and the top ops by self time.

    An op counts in the phase whose mark was open when it started, on any thread (generation
    runs in a worker thread); time in no phase goes to ``default``. A phase's ``outside ops``
    is its time minus its ops' self time.
    """
    ops_only = [e for e in events if not e.name.startswith(MARK)]
    if not ops_only:
        raise SystemExit("the profiler recorded no op")
    t0 = min(e.time_range.start for e in events)
    total_us = float(max(e.time_range.end for e in events) - t0)
    marks = _phase_marks(events)
    starts = [m[0] for m in marks]
    phase_us: dict[str, float] = {}
    for start, end, name in marks:
        phase_us[name] = phase_us.get(name, 0.0) + (end - start)
    phase_us[default] = phase_us.get(default, 0.0) + max(total_us - sum(phase_us.values()), 0.0)
    kinds: dict[str, dict[str, float]] = {}
    ops: dict[str, float] = {}
    for ev in ops_only:
        self_us = float(ev.self_cpu_time_total)
        if self_us <= 0:
            continue
        i = bisect.bisect_right(starts, ev.time_range.start) - 1
        phase = marks[i][2] if i >= 0 and ev.time_range.start < marks[i][1] else default
        by_kind = kinds.setdefault(phase, {})
        kind = op_kind(ev.name)
        by_kind[kind] = by_kind.get(kind, 0.0) + self_us
        ops[ev.name] = ops.get(ev.name, 0.0) + self_us
    out: dict[str, Any] = {"total_s": total_us / 1e6, "phases": {}}
    for phase, us in sorted(phase_us.items(), key=lambda kv: -kv[1]):
        by_kind = kinds.get(phase, {})
        row = {k: v / 1e6 for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}
        row["outside ops"] = max(us - sum(by_kind.values()), 0.0) / 1e6
        out["phases"][phase] = {"s": us / 1e6, "share": us / total_us, "kinds": row}
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:15]
    out["top_ops"] = {k: v / 1e6 for k, v in top}
    return out


def print_table(title: str, result: dict[str, Any]) -> None:
    """A markdown table: phases as rows, kinds of op as columns (seconds)."""
    kinds = ["matmul", "attention", "softmax", "elementwise", "memory", "optimizer", "other"]
    kinds.append("outside ops")
    print(f"\n{title}: {result['total_s']:.2f} s profiled\n")
    print("| phase | s | share | " + " | ".join(kinds) + " |")
    print("|---|---|---|" + "---|" * len(kinds))
    for phase, row in result["phases"].items():
        cells = [f"{row['kinds'].get(k, 0.0):.2f}" for k in kinds]
        print(
            f"| {phase} | {row['s']:.2f} | {100 * row['share']:.1f}% | " + " | ".join(cells) + " |"
        )
    print("\ntop ops (self s): " + ", ".join(f"{k} {v:.2f}" for k, v in result["top_ops"].items()))


def build_trainer(args: argparse.Namespace, callback: StepCallback) -> Any:
    from areal_m2po.trainer.rl_trainer import RLTrainer

    overrides = [
        "--config",
        args.config,
        f"output_dir={tempfile.mkdtemp(prefix='profile-step-')}",
        f"total_train_steps={args.steps}",
        f"num_threads={args.threads}",
        *QUIET_RUN,
        *args.overrides,
    ]
    return RLTrainer(load_config(overrides), callbacks=[callback])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[2] / "configs/default.yaml")
    )
    ap.add_argument("--steps", type=int, default=2, help="training steps to run")
    ap.add_argument("--step", type=int, default=2, help="the step to profile (1-based)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-eval", action="store_true", help="do not profile an evaluation")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides")
    args = ap.parse_args(argv)
    if not 1 <= args.step <= args.steps:
        raise SystemExit("--step must be between 1 and --steps")
    setup_process(args.threads, "no")
    callback = PhaseProfiler(args.step)
    trainer = build_trainer(args, callback)
    figures: dict[str, Any] = {}
    try:
        if not args.no_eval:
            engine = trainer.actor_engine
            trainer.rollout.start(engine.full_tensors, engine.version)
            with cpu_profile() as prof:
                ev = trainer.evaluate()
            figures["evaluate"] = breakdown(list(prof.events()), "evaluate")
            figures["evaluate"]["accuracy"] = ev["eval/accuracy"]
        trainer.train()
    finally:
        trainer.close()
    figures["step"] = breakdown(list(callback.result.events()), "other")
    if "evaluate" in figures:
        print_table("evaluation", figures["evaluate"])
    print_table(f"training step {args.step}", figures["step"])
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    print()
    for name, result in figures.items():
        print(f"{name}_s={result['total_s']:.3f}")
        for phase, row in result["phases"].items():
            print(f"{name}.{phase}_share={row['share']:.4f}")
    return figures


if __name__ == "__main__":
    main()
