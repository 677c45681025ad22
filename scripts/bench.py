"""Side-by-side performance figures of the trainer, every one a ratio measured in one run.

Run::

    python scripts/bench.py                      # --sizes 1m,10m --threads 1, ~4 minutes
    python scripts/bench.py --sizes smollm2 --repeats 3                    # ~20 minutes
    python scripts/bench.py --device cuda --amp bf16 --sizes 10m,135m     # on a GPU

Update timings are this process's CPU time on a CPU (``--clock``), wall time on a GPU.

For each model size it measures, with interleaved repeats (ours, bare, packed, matmul, ours, ...)
and medians, so that the shared CPU's swings hit every contender alike:

* ``overhead_ratio``: one PPO update step through ``PPOActor.ppo_update`` ->
  ``HFTrainEngine.train_batch`` (M2PO on, global scope, clipped PPO loss, entropy and stats,
  gradient clipping, AdamW), over a bare PyTorch step on an identical model: the same tokens and
  micro-batches (``split_microbatches``), padding columns trimmed, ``logits_to_keep``,
  ``cross_entropy`` log-probs, a policy-gradient loss, backward, ``AdamW.step``.
* ``packed_speedup``: the same update with ``mb_spec.packing=true`` (time padded / packed).
* ``m2po_fraction_of_update``: time inside the M2PO mask (``global_m2po_mask`` and, for the
  micro-batch scope, ``m2po.m2po_mask_and_stats``) over the update step.
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
import contextlib
import copy
import functools
import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

try:
    import areal_m2po  # noqa: F401
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from areal_m2po.api.cli_args import ActorConfig, MicroBatchSpec  # noqa: E402
from areal_m2po.engine.train_engine import HFTrainEngine, token_logprobs  # noqa: E402
from areal_m2po.trainer.ppo import actor as actor_mod  # noqa: E402
from areal_m2po.utils import m2po as m2po_mod  # noqa: E402
from areal_m2po.utils.advantages import group_normalize  # noqa: E402
from areal_m2po.utils.data import completion_start, split_microbatches, trim_columns  # noqa: E402

log = logging.getLogger("bench")

# -------------------------------------------------------------------------------------------
# models
# -------------------------------------------------------------------------------------------

# (hidden, layers, heads, kv heads, intermediate, vocab): Llamas built from a config, saved with
# the 99-token built-in tokenizer. "135m" is SmolLM2-135M's architecture with random weights (no
# download; its extra token ids decode to nothing, so rewards are 0 but every stage runs).
TINY_SIZES: dict[str, tuple[int, int, int, int, int, int | None]] = {
    "1m": (128, 5, 4, 2, 384, None),
    "10m": (384, 6, 6, 2, 1024, None),
    "135m": (576, 30, 9, 3, 1536, 49152),
}


@dataclass
class ModelSpec:
    name: str
    model: torch.nn.Module
    path: str  # a folder RLTrainer can load (model + tokenizer)
    n_params: int
    matmul_params: int  # parameters of the per-token matmuls (not the input embedding)
    hidden: int
    layers: int
    q_dim: int  # heads x head_dim
    vocab: int
    prompt_len: tuple[int, int]  # prompt lengths of the synthetic batch (min, max)


def _count_matmul_params(model: torch.nn.Module) -> int:
    """Weights of the decoder layers' linear maps (the LM head is counted per scored token)."""
    total = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            total += mod.weight.numel()
    return total


def _spec_from_model(name: str, model: torch.nn.Module, path: str, prompt_len: tuple[int, int]):
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelSpec(
        name=name,
        model=model,
        path=path,
        n_params=sum(p.numel() for p in model.parameters()),
        matmul_params=_count_matmul_params(model),
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        q_dim=cfg.num_attention_heads * head_dim,
        vocab=cfg.vocab_size,
        prompt_len=prompt_len,
    )


def build_model(name: str, workdir: Path) -> ModelSpec:
    """A tiny Llama from a config (saved with the built-in tokenizer), or SmolLM2-135M."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if name in TINY_SIZES:
        from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        hidden, layers, heads, kv, inter, vocab = TINY_SIZES[name]
        config = LlamaConfig(
            vocab_size=vocab or len(tok),
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=2048,
            tie_word_embeddings=True,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
            bos_token_id=None,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        path = workdir / f"model-{name}"
        model.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return _spec_from_model(name, model, str(path), (24, 40) if vocab is None else (30, 44))
    if name == "smollm2":
        from areal_m2po.engine.builtin_models import resolve_model_path

        path = resolve_model_path("builtin:smollm2-135m-instruct")
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        )
        return _spec_from_model(name, model, path, (30, 44))
    raise SystemExit(f"unknown size {name!r}: use {', '.join(TINY_SIZES)} or smollm2")


# -------------------------------------------------------------------------------------------
# a synthetic rollout batch in the trainer's layout
# -------------------------------------------------------------------------------------------


def synthetic_batch(
    spec: ModelSpec, n_prompts: int, n_samples: int, max_new: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Left-padded prompts, completions from one column, right padding after EOS; behaviour and
    proximal log-probs that differ (so M2PO masks tokens); non-zero group advantages."""
    g = torch.Generator().manual_seed(seed)
    n = n_prompts * n_samples
    lo, hi = spec.prompt_len
    p_lens = torch.randint(lo, hi + 1, (n_prompts,), generator=g).repeat_interleave(n_samples)
    c_lens = torch.randint(max(1, max_new // 4), max_new + 1, (n,), generator=g)
    c_lens[0] = max_new
    p_max = int(p_lens.max())
    t = p_max + max_new
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    loss = torch.zeros(n, t, dtype=torch.bool)
    for i in range(n):
        p, c = int(p_lens[i]), int(c_lens[i])
        ids[i, p_max - p : p_max + c] = torch.randint(3, spec.vocab, (p + c,), generator=g)
        attn[i, p_max - p : p_max + c] = True
        loss[i, p_max : p_max + c] = True
    behave = -torch.rand(n, t, generator=g) * 3.0 * loss
    prox = (behave + 0.3 * torch.randn(n, t, generator=g)) * loss
    rewards = torch.rand(n, generator=g)
    adv = group_normalize(rewards, group_size=n_samples)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "logprobs": behave,
        "prox_logp": prox,
        "versions": torch.where(loss, 0, -1),
        "rewards": rewards,
        "no_eos": torch.zeros(n, dtype=torch.bool),
        "advantages": adv[:, None] * loss,
    }


# -------------------------------------------------------------------------------------------
# timing helpers
# -------------------------------------------------------------------------------------------


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


@dataclass
class M2POTimer:
    """Accumulates the time spent inside the M2PO mask functions while patched in."""

    clock: Clock
    seconds: float = 0.0
    calls: int = 0
    _saved: list[tuple[Any, str, Any]] = field(default_factory=list)

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = self.clock.now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += self.clock.now() - t0
                self.calls += 1

        return timed

    @contextlib.contextmanager
    def patched(self) -> Iterator[M2POTimer]:
        targets = [
            (actor_mod, "global_m2po_mask"),
            (m2po_mod, "m2po_mask_and_stats"),
        ]
        for mod, name in targets:
            orig = getattr(mod, name)
            self._saved.append((mod, name, orig))
            setattr(mod, name, self._wrap(orig))
        try:
            yield self
        finally:
            for mod, name, orig in reversed(self._saved):
                setattr(mod, name, orig)
            self._saved.clear()


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


# -------------------------------------------------------------------------------------------
# the update step: ours vs bare PyTorch
# -------------------------------------------------------------------------------------------


def make_ours(
    spec: ModelSpec,
    batch: dict[str, torch.Tensor],
    mb_spec: MicroBatchSpec,
    accelerator: Any,
    packing: bool,
    m2_scope: str,
    group_size: int,
) -> Callable[[], dict[str, float]]:
    from areal_m2po.trainer.ppo.actor import PPOActor

    cfg = ActorConfig(
        path="unused",
        m2_threshold=0.04,
        m2_scope=m2_scope,
        mb_spec=MicroBatchSpec(
            n_mbs=mb_spec.n_mbs, max_tokens_per_mb=mb_spec.max_tokens_per_mb, packing=packing
        ),
    )
    cfg.optimizer.lr = 1e-6
    engine = HFTrainEngine(cfg, accelerator, total_steps=10_000, model=copy.deepcopy(spec.model))
    actor = PPOActor(cfg, engine, group_size, max_new_tokens=int(batch["input_ids"].shape[1]))

    def step() -> dict[str, float]:
        return actor.ppo_update(dict(batch))

    return step


def make_bare(
    spec: ModelSpec,
    batch: dict[str, torch.Tensor],
    mb_spec: MicroBatchSpec,
    device: torch.device,
    amp: str,
) -> Callable[[], None]:
    """Plain PyTorch: same micro-batches, trimmed columns, logits_to_keep, cross_entropy."""
    model = copy.deepcopy(spec.model).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    idx_list = split_microbatches(batch, mb_spec.n_mbs, mb_spec.max_tokens_per_mb)
    mbs = []
    for idx in idx_list:
        mb = {k: v.index_select(0, idx) for k, v in batch.items()}
        trimmed, _, _ = trim_columns(mb)
        start = completion_start(trimmed)
        mbs.append((trimmed, start))
    n_total = float(batch["loss_mask"].sum())
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if amp == "bf16"
        else contextlib.nullcontext()
    )

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        for trimmed, start in mbs:
            ids = trimmed["input_ids"].to(device)
            attn = trimmed["attention_mask"].to(device).long()
            mask = trimmed["loss_mask"][:, start:].to(device)
            adv = trimmed["advantages"][:, start:].to(device)
            old = trimmed["prox_logp"][:, start:].to(device)
            pos = (attn.cumsum(-1) - 1).clamp(min=0)
            with autocast:
                out = model(
                    input_ids=ids,
                    attention_mask=attn,
                    position_ids=pos,
                    logits_to_keep=ids.shape[1] - start + 1,
                    use_cache=False,
                )
            logits = out.logits[:, :-1].float()
            labels = ids[:, start:]
            logp = -torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none"
            ).view_as(labels)
            ratio = torch.exp(logp - old)
            loss = -(ratio * adv * mask).sum() / n_total
            loss.backward()
        opt.step()

    return step


# -------------------------------------------------------------------------------------------
# model FLOPs of one update step
# -------------------------------------------------------------------------------------------


def update_flops(spec: ModelSpec, batch: dict[str, torch.Tensor]) -> float:
    """Forward + backward (3 x forward) model FLOPs on the real tokens, padding not counted."""
    lengths = batch["attention_mask"].sum(-1).double()
    n_tokens = float(lengths.sum())
    n_scored = float(batch["loss_mask"].sum())
    dense = 2.0 * spec.matmul_params * n_tokens
    attn = 2.0 * spec.layers * spec.q_dim * float((lengths * (lengths + 1)).sum())  # causal
    head = 2.0 * spec.hidden * spec.vocab * n_scored
    return 3.0 * (dense + attn + head)


# -------------------------------------------------------------------------------------------
# log-prob memory
# -------------------------------------------------------------------------------------------


def _walk(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


def peak_extra_bytes(fn: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated above the level at entry while ``fn`` runs (what it keeps counts)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated() - base)
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    tree = prof.profiler.kineto_results.experimental_event_tree()
    allocs = sorted(
        (n for n in _walk(tree) if n.tag == _EventType.Allocation), key=lambda n: n.start_time_ns
    )
    cur = peak = 0
    for a in allocs:
        cur += a.extra_fields.alloc_size
        peak = max(peak, cur)
    return peak


def logprob_memory(
    n_rows: int, vocab: int, device: torch.device, dtype: torch.dtype
) -> dict[str, float]:
    """Peak extra memory / logits size: engine path vs full log_softmax, no-grad and training."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n_rows, vocab, generator=g).to(device=device, dtype=dtype)
    labels = torch.randint(0, vocab, (n_rows,), generator=g).to(device)
    size = logits.numel() * logits.element_size()
    grad_out = torch.randn(n_rows, generator=g).to(device)

    def ours_fwd() -> None:
        with torch.no_grad():
            token_logprobs(logits, labels, 1.0, True)

    def full_fwd() -> None:
        with torch.no_grad():
            x = torch.log_softmax(logits.float(), -1)
            x.gather(-1, labels[:, None])
            -(x.exp() * x).sum(-1)

    def ours_train() -> None:
        leaf = logits.detach().requires_grad_(True)
        lp, _ = token_logprobs(leaf, labels, 1.0, True)
        (lp * grad_out).sum().backward()

    def full_train() -> None:
        leaf = logits.detach().requires_grad_(True)
        x = torch.log_softmax(leaf.float(), -1)
        lp = x.gather(-1, labels[:, None]).squeeze(-1)
        with torch.no_grad():
            -(x.exp() * x).sum(-1)
        (lp * grad_out).sum().backward()

    out = {}
    for name, fn in (
        ("ours_fwd", ours_fwd),
        ("full_fwd", full_fwd),
        ("ours_train", ours_train),
        ("full_train", full_train),
    ):
        fn()  # warm-up
        out[name] = peak_extra_bytes(fn, device) / size
    out["logits_mb"] = size / 2**20
    out["vocab"] = float(vocab)
    return out


# -------------------------------------------------------------------------------------------
# RL step breakdown through RLTrainer
# -------------------------------------------------------------------------------------------


def rl_breakdown(
    spec: ModelSpec, steps: int, threads: int, n_prompts: int, n_samples: int, max_new: int
) -> dict[str, float]:
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer.rl_trainer import RLTrainer

    out_dir = tempfile.mkdtemp(prefix="bench-rl-")
    overrides = [
        f"output_dir={out_dir}",
        f"total_train_steps={steps}",
        f"num_threads={threads}",
        f"actor.path={spec.path}",
        f"ref.path={spec.path}",
        "actor.m2_threshold=0.04",
        "actor.kl_ctl=0.01",
        "actor.optimizer.lr=1e-6",
        f"gconfig.n_samples={n_samples}",
        f"gconfig.max_new_tokens={max_new}",
        "rollout.staleness=1",
        f"train_dataset.batch_size={n_prompts}",
        "valid_dataset.max_samples=8",
        "evaluator.freq_steps=null",
        "evaluator.eval_at_start=false",
        "evaluator.eval_at_end=false",
        "saver.save_at_end=false",
        "stats_logger.jsonl=false",
        "stats_logger.console=false",
        "stats_logger.progress_bar=false",
    ]
    cfg = load_config(overrides)
    trainer = RLTrainer(cfg)
    rows: list[dict[str, float]] = []
    orig_log = trainer.stats_logger.log

    def capture(step: int, stats: dict[str, float]) -> None:
        rows.append(dict(stats))
        orig_log(step, stats)

    trainer.stats_logger.log = capture  # type: ignore[method-assign]
    try:
        trainer.train()
    finally:
        trainer.close()
    # with staleness 1 the batch trained at step j was generated during step j - 1, and its
    # generation time is logged with it: the generation done inside step j is in rows[j + 1].
    # The first step (warm-up) and the last (its generation is never logged) are left out.
    if len(rows) < 3:
        raise SystemExit("--rl-steps must be at least 3")
    timed = rows[1:-1]
    gens = rows[2:]

    def total(key: str, src: list[dict[str, float]] = timed) -> float:
        return sum(r.get(key, 0.0) for r in src)

    # shares of the summed step time (additive, unlike medians of the parts)
    step_s = total("timing/step_s")
    gen = total("timing/gen_s", gens) + total("timing/reward_s", gens)
    prox, ref, upd = total("timing/prox_s"), total("timing/ref_s"), total("timing/update_s")
    other = step_s - gen - prox - ref - upd
    n_seq = n_prompts * n_samples
    tokens = sum(r.get("rollout/gen_len_mean", 0.0) * n_seq for r in gens)
    return {
        "step_s": step_s / len(timed),
        "gen_pct": 100 * gen / step_s,
        "logprob_pct": 100 * prox / step_s,
        "ref_pct": 100 * ref / step_s,
        "update_pct": 100 * upd / step_s,
        "other_pct": 100 * other / step_s,
        "completion_tok_per_s": tokens / step_s,
    }


# -------------------------------------------------------------------------------------------
# driver
# -------------------------------------------------------------------------------------------


def time_update(
    spec: ModelSpec,
    batch: dict[str, torch.Tensor],
    mb_spec: MicroBatchSpec,
    accelerator: Any,
    clock: Clock,
    args: argparse.Namespace,
) -> dict[str, float]:
    """Interleaved rounds of ours (padded), bare, ours (packed) and the matmul probe."""
    device = torch.device(args.device)
    ours = make_ours(spec, batch, mb_spec, accelerator, False, args.m2_scope, args.samples)
    packed = make_ours(spec, batch, mb_spec, accelerator, True, args.m2_scope, args.samples)
    bare = make_bare(spec, batch, mb_spec, device, args.amp)
    mm_dtype = torch.bfloat16 if args.amp == "bf16" else torch.float32
    mm, mm_flops = matmul_probe(device, mm_dtype, args.matmul_n)
    timer = M2POTimer(clock)
    m2po_share: list[float] = []

    def ours_timed() -> None:
        before = timer.seconds
        t0 = clock.now()
        with timer.patched():
            ours()
        m2po_share.append((timer.seconds - before) / (clock.now() - t0))

    times = interleaved(
        {"ours": ours_timed, "bare": bare, "packed": packed, "matmul": mm},
        args.repeats,
        clock,
    )
    med = {k: statistics.median(v) for k, v in times.items()}
    flops = update_flops(spec, batch)

    def mfu(key: str) -> float:
        return statistics.median(
            (flops / t) / (mm_flops / m) for t, m in zip(times[key], times["matmul"])
        )

    log.info(
        "rounds: %s",
        json.dumps({k: [round(x, 4) for x in v] for k, v in times.items()}),
    )
    return {
        "ours_s": med["ours"],
        "bare_s": med["bare"],
        "packed_s": med["packed"],
        "overhead_ratio": statistics.median(o / b for o, b in zip(times["ours"], times["bare"])),
        "packed_speedup": statistics.median(o / p for o, p in zip(times["ours"], times["packed"])),
        "m2po_fraction_of_update": statistics.median(m2po_share[-args.repeats :]),
        "update_gflop": flops / 1e9,
        "matmul_peak_gflops": mm_flops / med["matmul"] / 1e9,
        "mfu": mfu("ours"),
        "mfu_bare": mfu("bare"),
        "mfu_packed": mfu("packed"),
    }


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
    log.info("[%s] update: %s", name, json.dumps({k: _r(v) for k, v in res.items()}))
    gc.collect()

    # log-prob memory at this model's vocabulary, on the scored rows of the batch (at least 1k)
    mem_rows = max(int(batch["loss_mask"].sum()) + args.prompts * args.samples, 1024)
    mem = logprob_memory(mem_rows, spec.vocab, device, torch.float32)
    res.update({f"mem_{k}": v for k, v in mem.items()})
    res["logprob_peak_mem_ratio"] = max(mem["ours_fwd"], mem["ours_train"])
    log.info("[%s] memory: %s", name, json.dumps({k: _r(v) for k, v in mem.items()}))

    if args.rl_steps > 0:
        rl = rl_breakdown(spec, args.rl_steps, args.threads, args.prompts, args.samples, 16)
        res.update({f"rl_{k}": v for k, v in rl.items()})
        log.info("[%s] rl step: %s", name, json.dumps({k: _r(v) for k, v in rl.items()}))
    return res


def _r(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


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
    # every Accelerator of the process (ours and RLTrainer's) must agree on mixed precision
    os.environ["ACCELERATE_MIXED_PRECISION"] = "bf16" if args.amp == "bf16" else "no"
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    for noisy in ("areal_m2po", "transformers", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    log.info("torch %s, %s, %d threads, %s", torch.__version__, args.device, args.threads, args.amp)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
            results.append(bench_size(size, args, Path(tmp)))
    # the log-prob memory at a real vocabulary (SmolLM2's), whatever the model sizes run:
    # the scored positions of a 64 x 16-token GRPO batch plus one per sequence
    mem = logprob_memory(args.mem_rows, args.mem_vocab, torch.device(args.device), torch.float32)
    log.info(
        "memory at vocab %d: %s", args.mem_vocab, json.dumps({k: _r(v) for k, v in mem.items()})
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
