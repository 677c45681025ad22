"""One PPO update of the tiny model on a fixed global batch, in 1 or N processes.

    python tests/support/multiproc_worker.py OUT.pt                                  # one process
    accelerate launch --multi_gpu --num_processes 2 tests/support/multiproc_worker.py OUT.pt \
        [ddp | fsdp2 | fsdp2+accumulate]

Every process builds the same global batch (seeded, independent of the rank) with stale
behaviour log-probs, so M2PO masks some tokens, and keeps its contiguous share of whole groups,
as the trainer does. Rank 0 writes the update's stats, the global M2PO mask and the updated
weights to OUT.pt; ``tests/multiproc/test_multiproc.py`` compares the 1- and 2-process results. With
``fsdp2`` the policy is sharded over the processes (``actor.backend=fsdp2``).
"""

from __future__ import annotations

import dataclasses
import sys

import torch

N_GROUPS = 4
GROUP = 4
PROMPT_MAX = 6
COMPLETION_MAX = 8
M2_THRESHOLD = 0.04


def build_global_batch(vocab: int) -> dict[str, torch.Tensor]:
    """16 rows in the rollout layout: left-padded prompts, ragged completions, random rewards."""
    g = torch.Generator().manual_seed(1234)
    rows = N_GROUPS * GROUP
    width = PROMPT_MAX + COMPLETION_MAX
    input_ids = torch.randint(3, vocab, (rows, width), generator=g)
    attention = torch.zeros(rows, width, dtype=torch.bool)
    loss_mask = torch.zeros(rows, width, dtype=torch.bool)
    for grp in range(N_GROUPS):
        p_len = int(torch.randint(2, PROMPT_MAX + 1, (1,), generator=g))
        prompt = input_ids[grp * GROUP, PROMPT_MAX - p_len : PROMPT_MAX].clone()
        for j in range(GROUP):
            r = grp * GROUP + j
            input_ids[r, PROMPT_MAX - p_len : PROMPT_MAX] = prompt
            # ragged completions: the ranks hold different numbers of valid tokens
            c_len = int(torch.randint(1, COMPLETION_MAX + 1, (1,), generator=g))
            attention[r, PROMPT_MAX - p_len : PROMPT_MAX + c_len] = True
            loss_mask[r, PROMPT_MAX : PROMPT_MAX + c_len] = True
    input_ids = torch.where(attention, input_ids, torch.zeros_like(input_ids))
    versions = torch.where(loss_mask, torch.zeros_like(input_ids), torch.full_like(input_ids, -1))
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "versions": versions,
        "rewards": torch.rand(rows, generator=g),
        "no_eos": torch.zeros(rows, dtype=torch.bool),
        # behaviour noise, added to the proximal log-probs below: a stale behaviour policy
        "_noise": torch.randn(rows, width, generator=g) * 0.35,
    }


def main(out_path: str, backend: str = "ddp") -> None:
    torch.set_num_threads(1)
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import (
        ActorConfig,
        FSDPEngineConfig,
        MicroBatchSpec,
        OptimizerConfig,
    )
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.trainer.ppo import actor as actor_mod
    from areal_m2po.utils import dist
    from areal_m2po.utils.data import select_rows

    accelerator = Accelerator(cpu=True)
    rank, world = dist.rank(), dist.world_size()
    cfg = ActorConfig(
        path="builtin:tiny",
        m2_threshold=M2_THRESHOLD,
        m2_scope="global",
        ppo_n_minibatches=1,  # minibatches are cut per rank: only one is rank-invariant
        mb_spec=MicroBatchSpec(n_mbs=2),
        optimizer=OptimizerConfig(type="sgd", lr=0.1, beta1=0.0),
        backend=backend.split("+")[0],
        # fsdp2+accumulate: no reduce-scatter before the last micro-batch
        fsdp=FSDPEngineConfig(accumulate_unsharded_grads=backend.endswith("+accumulate")),
    )
    engine = HFTrainEngine(cfg, accelerator, total_steps=2)
    actor = actor_mod.PPOActor(cfg, engine, group_size=GROUP, max_new_tokens=COMPLETION_MAX)

    full = build_global_batch(int(engine.unwrapped.config.vocab_size))
    per = full["input_ids"].shape[0] // world
    batch = select_rows(full, torch.arange(rank * per, (rank + 1) * per))
    noise = batch.pop("_noise")
    batch["prox_logp"] = actor.compute_logp(batch)
    batch["behave_logp"] = (batch["prox_logp"] + noise) * batch["loss_mask"]
    actor.compute_advantages(batch)

    initial = {k: v.clone() for k, v in engine.state_dict_for_sync().items()}
    masks: list[torch.Tensor] = []
    real = actor_mod.global_m2po_mask

    def recording(*args, **kwargs):
        keep, stats = real(*args, **kwargs)
        masks.append(keep.clone())
        return keep, stats

    actor_mod.global_m2po_mask = recording
    stats = actor.ppo_update(batch)

    if dist.is_distributed():
        gathered: list[list[torch.Tensor] | None] = [None] * world
        torch.distributed.all_gather_object(gathered, masks)
    else:
        gathered = [masks]
    result = {
        "world": world,
        "stats": stats,
        "masks": gathered,
        "state": {k: v.clone() for k, v in engine.state_dict_for_sync().items()},
        "initial": initial,
        "n_valid_local": int(batch["loss_mask"].sum()),
    }
    if world > 1:
        # dynamic filtering can leave the ranks different numbers of groups: with 2 minibatches
        # rank 0 (2 groups) and rank 1 (1 group) must still take the same optimizer steps
        actor_mod.global_m2po_mask = real
        uneven_cfg = dataclasses.replace(cfg, ppo_n_minibatches=2)
        uneven_actor = actor_mod.PPOActor(uneven_cfg, engine, GROUP, COMPLETION_MAX)
        rows = torch.arange(GROUP * (2 if rank == 0 else 1))
        result["uneven_stats"] = uneven_actor.ppo_update(select_rows(batch, rows))
        # rank 1 holds one row: one micro-batch to rank 0's two (fsdp2: an idle forward and
        # backward keep it in step)
        rows = torch.arange(GROUP if rank == 0 else 1)
        result["uneven_mb_stats"] = uneven_actor.ppo_update(select_rows(batch, rows))
        result["state_after_uneven"] = {
            k: v.clone() for k, v in engine.state_dict_for_sync().items()
        }
        result.update(empty_rank_updates(actor, batch, rank))
    if rank == 0:
        torch.save(result, out_path)
    accelerator.wait_for_everyone()
    accelerator.end_training()


def _without_tokens(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``batch`` with every row truncated away (no loss-mask token, zero advantages)."""
    out = dict(batch)
    out["loss_mask"] = torch.zeros_like(batch["loss_mask"])
    out["advantages"] = torch.zeros_like(batch["advantages"])
    return out


def empty_rank_updates(actor, batch: dict[str, torch.Tensor], rank: int) -> dict[str, object]:
    """Two updates: rank 1 alone has no loss-mask token, then no rank has one.

    A rank with nothing to score must still run the same forward/backward passes (DDP's
    gradient hooks) and take, or skip, the same optimizer step as the others. Returns both
    updates' stats and, per rank, a checksum of the weights after each update.
    """
    from areal_m2po.utils import dist

    def checksum() -> float:
        # full tensors: the same sum whether the weights are sharded or not
        return float(sum(v.double().sum() for v in actor.engine.state_dict_for_sync().values()))

    out: dict[str, object] = {}
    one_empty = _without_tokens(batch) if rank == 1 else batch
    out["one_empty_stats"] = actor.ppo_update(one_empty)
    after_one = checksum()
    out["all_empty_stats"] = actor.ppo_update(_without_tokens(batch))
    sums = [after_one, checksum()]
    gathered: list[list[float] | None] = [None] * dist.world_size()
    torch.distributed.all_gather_object(gathered, sums)
    out["empty_checksums"] = gathered
    return out


if __name__ == "__main__":
    main(*sys.argv[1:])
    from areal_m2po.utils.dist import exit_skipping_finalization

    exit_skipping_finalization(0)  # gloo can abort a finalising interpreter (SIGABRT)
