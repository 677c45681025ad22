"""Peak resident memory of the main job's RL steps, phase by phase, over its persistent state.

Run::

    python scripts/bench/bench_memory.py                       # the main job's shape, 2 steps, 1 thread
    python scripts/bench/bench_memory.py --profile             # + what is alive at the update's peak
    python scripts/bench/bench_memory.py --config configs/tiny.yaml --steps 3   # seconds

It runs ``RLTrainer`` on ``configs/default.yaml`` (SmolLM2-135M-Instruct fp32, 8 prompts x 8
samples, 16 new tokens, staleness 1: the second step recomputes the proximal log-probs) for
``--steps`` steps with the evaluation at start and end (128 held-out prompts in one generation
batch) and the final HF checkpoint, as the main job does. Pass ``actor.skip_zero_adv_seqs=false``
for the main job's largest step: every one of the 64 rows in the update (late in the main job
up to 56 of them are; early on 16-24, the rest having zero advantage). A thread samples the resident set
every 2 ms (``benchlib/rss_phases.py``) under the label of the current phase: the trainer's own
phases through its step callbacks, and ``evaluate``, ``checkpoint``, ``update.forward_backward``
(the micro-batches' forward and backward passes) and ``update.optimizer`` (clipping and the
AdamW step) by wrapping those calls of this trainer object (they still do what they did).

The persistent state is the bytes of the policy's parameters, their gradients (the size of the
trainable parameters), the optimizer's state, the rollout engine's copy of the policy and the
reference model (when ``actor.kl_ctl`` > 0). ``peak_rss_over_state`` is the peak resident set
during the training steps (generation to weight sync, evaluation and checkpointing excluded)
over that state; ``peak_rss_over_state_all`` includes them. With ``--profile``, the second
step's forward and backward run under ``torch.profiler(profile_memory=True)``
(``benchlib/alloc_profile.py``) and the bytes alive at its allocation peak are listed by the
operator that allocated them; the profiler's own memory then inflates that step's resident set,
so take the peaks from a run without ``--profile``.

Extra ``key=value`` arguments override the config (e.g. ``actor.mb_spec.max_tokens_per_mb=512``).
The last lines are ``name=value``.
"""

from __future__ import annotations

import argparse
import gc
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

import torch  # noqa: E402
from benchlib.alloc_profile import live_at_peak  # noqa: E402
from benchlib.harness import setup_process  # noqa: E402
from benchlib.rss_phases import PhaseMarks, RssSampler, labelled_as, mark, rss_bytes  # noqa: E402

from areal_m2po.api.config_loader import load_config  # noqa: E402

GB = 1e9
STEP_PHASES = ("generate", "prox", "ref", "advantages", "update", "m2po", "sync")
STEP_PHASES += ("update.forward_backward", "update.optimizer")


def _tensor_bytes(tensors: Any) -> int:
    """Bytes of the distinct storages of ``tensors`` (tied weights count once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _rollout_model(trainer: Any) -> torch.nn.Module:
    """The rollout engine's copy of the policy (HF engine: executor -> engine -> HFGenerator)."""
    for path in (("rollout", "engine", "generator", "model"), ("rollout", "model")):
        obj = trainer
        for name in path:
            obj = getattr(obj, name, None)
        if isinstance(obj, torch.nn.Module):
            return obj
    raise SystemExit("bench_memory: no in-process rollout model (rollout.backend must be hf)")


def state_bytes(trainer: Any) -> dict[str, int]:
    """Bytes of the persistent state (see the module docstring), by part."""
    actor = trainer.actor_engine
    params = list(actor.unwrapped.parameters())
    out = {
        "weights": _tensor_bytes(params),
        "grads": _tensor_bytes(p for p in params if p.requires_grad),
        "optimizer": _tensor_bytes(
            v for st in actor.optimizer.state.values() for v in st.values() if v.dim() > 0
        ),
        "rollout_copy": _tensor_bytes(_rollout_model(trainer).state_dict().values()),
    }
    if trainer.ref_engine is not None:
        out["reference"] = _tensor_bytes(trainer.ref_engine.unwrapped.state_dict().values())
    return out


def _instrument(trainer: Any, sampler: RssSampler, profile_step: int | None) -> dict[str, Any]:
    """Label evaluation, checkpoints, forward+backward and the optimizer step; optionally
    profile the allocations of one step's forward and backward passes."""
    eng = trainer.actor_engine
    trainer.evaluate = mark(sampler, "evaluate", trainer.evaluate)
    trainer.save_hf = mark(sampler, "checkpoint", trainer.save_hf)
    trainer.save_checkpoint = mark(sampler, "checkpoint", trainer.save_checkpoint)
    eng._optimizer_step = mark(sampler, "update.optimizer", eng._optimizer_step)
    eng._clip_grad_norm = mark(sampler, "update.optimizer", eng._clip_grad_norm)
    found: dict[str, Any] = {}
    accumulate = eng._accumulate_gradients
    calls = [0]

    def forward_backward(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        with labelled_as(sampler, "update.forward_backward"):
            if calls[0] != profile_step:
                return accumulate(*args, **kwargs)
            box: list[Any] = []
            peak, by_op = live_at_peak(lambda: box.append(accumulate(*args, **kwargs)))
            found.update(peak=peak, by_op=by_op)
            return box[0]

    eng._accumulate_gradients = forward_backward
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--config", default=str(Path(__file__).resolve().parents[2] / "configs/default.yaml")
    )
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="profile the last step's fwd+bwd")
    ap.add_argument("--no-eval", action="store_true", help="skip evaluation and checkpoint")
    ap.add_argument("--json", default=None, help="also write the figures to this file")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    setup_process(args.threads, "no")
    from areal_m2po.trainer.rl_trainer import RLTrainer

    out_dir = tempfile.mkdtemp(prefix="bench-mem-")
    print(f"bench_memory: output_dir={out_dir}", flush=True)
    overrides = [
        f"output_dir={out_dir}",
        f"total_train_steps={args.steps}",
        f"num_threads={args.threads}",
        "stats_logger.console=false",
        "stats_logger.progress_bar=false",
        "evaluator.freq_steps=null",
    ]
    if args.no_eval:
        overrides += ["evaluator.eval_at_start=false", "evaluator.eval_at_end=false"]
        overrides += ["saver.save_at_end=false"]
    cfg = load_config(["--config", args.config, *overrides, *args.overrides])
    sampler = RssSampler().start()
    rss_start = rss_bytes()
    with labelled_as(sampler, "build"):
        trainer = RLTrainer(cfg, callbacks=[PhaseMarks(sampler)])
    rss_built = rss_bytes()
    profiled = _instrument(trainer, sampler, args.steps if args.profile else None)
    try:
        trainer.train()
    finally:
        trainer.close()
    sampler.stop()
    state = state_bytes(trainer)
    total_state = sum(state.values())
    peaks = dict(sampler.peaks)
    step_peak = max(v for k, v in peaks.items() if k in STEP_PHASES)
    del trainer
    gc.collect()
    figures: dict[str, Any] = {
        "rss_at_start_gb": rss_start / GB,
        "rss_after_build_gb": rss_built / GB,
        "state_gb": {k: v / GB for k, v in state.items()},
        "state_total_gb": total_state / GB,
        "peak_rss_by_phase_gb": {
            k: v / GB for k, v in sorted(peaks.items(), key=lambda kv: -kv[1])
        },
        "peak_rss_step_gb": step_peak / GB,
        "peak_rss_all_gb": sampler.overall / GB,
        "peak_rss_all_at": {"step": sampler.overall_at[0], "phase": sampler.overall_at[1]},
        "peak_rss_by_step_gb": {k: v / GB for k, v in sorted(sampler.by_step.items())},
        "peak_rss_over_state": step_peak / total_state,
        "peak_rss_over_state_all": sampler.overall / total_state,
    }
    if profiled:
        figures["update_alloc_peak_gb"] = profiled["peak"] / GB
        figures["update_live_at_peak_gb"] = {
            k: v / GB for k, v in list(profiled["by_op"].items())[:12]
        }
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    print(f"peak_rss_step_gb={step_peak / GB:.2f}")
    print(f"peak_rss_all_gb={sampler.overall / GB:.2f}")
    print(f"state_gb={total_state / GB:.2f}")
    print(f"peak_rss_over_state={step_peak / total_state:.2f}")
    print(f"peak_rss_over_state_all={sampler.overall / total_state:.2f}")


if __name__ == "__main__":
    main()
