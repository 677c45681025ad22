"""Figures of one PPO update step: ``overhead_ratio`` (ours over a bare PyTorch step on the
same tokens), ``packed_speedup``, ``m2po_fraction_of_update`` (timed through the actor's
``m2po`` phase callback) and ``mfu`` against a matmul probe, all from interleaved rounds."""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import statistics
from collections.abc import Callable
from typing import Any

import torch

from areal_m2po.api.callbacks import Phases
from areal_m2po.api.cli_args import ActorConfig, MicroBatchSpec
from areal_m2po.engine.train_engine import HFTrainEngine
from areal_m2po.trainer.ppo.actor import PPOActor
from areal_m2po.utils.data import completion_start, split_microbatches, trim_columns
from benchlib.harness import Clock, PhaseTimer, interleaved, matmul_probe, median_ratio
from benchlib.models import ModelSpec, update_flops

log = logging.getLogger("bench")


def make_ours(
    spec: ModelSpec,
    batch: dict[str, torch.Tensor],
    mb_spec: MicroBatchSpec,
    accelerator: Any,
    packing: bool,
    m2_scope: str,
    group_size: int,
    phases: Phases | None = None,
) -> Callable[[], dict[str, float]]:
    """One ``PPOActor.ppo_update`` on a copy of the model (M2PO on), reporting to ``phases``."""

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
    max_new = int(batch["input_ids"].shape[1])
    actor = PPOActor(cfg, engine, group_size, max_new, phases=phases)

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
    timer = PhaseTimer(clock, ["m2po"])  # the M2PO mask, reported by the actor
    ours = make_ours(
        spec, batch, mb_spec, accelerator, False, args.m2_scope, args.samples, Phases([timer])
    )
    packed = make_ours(spec, batch, mb_spec, accelerator, True, args.m2_scope, args.samples)
    bare = make_bare(spec, batch, mb_spec, device, args.amp)
    mm_dtype = torch.bfloat16 if args.amp == "bf16" else torch.float32
    mm, mm_flops = matmul_probe(device, mm_dtype, args.matmul_n)
    m2po_share: list[float] = []

    def ours_timed() -> None:
        before = timer.seconds
        t0 = clock.now()
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
        return median_ratio(
            [flops / t for t in times[key]], [mm_flops / m for m in times["matmul"]]
        )

    log.info(
        "rounds: %s",
        json.dumps({k: [round(x, 4) for x in v] for k, v in times.items()}),
    )
    return {
        "ours_s": med["ours"],
        "bare_s": med["bare"],
        "packed_s": med["packed"],
        "overhead_ratio": median_ratio(times["ours"], times["bare"]),
        "packed_speedup": median_ratio(times["ours"], times["packed"]),
        "m2po_fraction_of_update": statistics.median(m2po_share[-args.repeats :]),
        "update_gflop": flops / 1e9,
        "matmul_peak_gflops": mm_flops / med["matmul"] / 1e9,
        "mfu": mfu("ours"),
        "mfu_bare": mfu("bare"),
        "mfu_packed": mfu("packed"),
    }
