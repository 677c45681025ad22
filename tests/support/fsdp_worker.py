"""A short FSDP2 training run of the tiny model, checked from inside, for ``tests/multiproc/test_fsdp.py``.

    accelerate launch --multi_gpu --num_processes 2 tests/support/fsdp_worker.py OUT.pt OUTPUT_DIR

Actor, reference and critic are sharded (``backend=fsdp2``). After each training step (which
ends with the rollout sync) every rank records how far the rollout engine's weights are from
the gathered policy, and how far the behaviour log-probs of a fresh batch generated after the
sync are from a forward of the sharded policy. Then an HF save is loaded back with
``from_pretrained`` on rank 0 and compared with the gathered policy. Rank 0 writes the numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"

STEPS = 2


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def main(out_path: str, output_dir: str) -> None:
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer.rl_trainer import RLTrainer
    from areal_m2po.utils import dist

    cfg = load_config(
        [
            "--config",
            str(TINY),
            f"output_dir={output_dir}",
            "num_threads=1",
            "reward.path=toy_rewards:digit_fraction",
            "actor.backend=fsdp2",
            "actor.kl_ctl=0.01",
            "actor.adv_norm.mean_level=batch",
            "critic.enabled=true",
            "critic.backend=fsdp2",
            "critic.path=builtin:tiny",
        ]
    )
    trainer = RLTrainer(cfg)
    engines = [trainer.actor_engine, trainer.ref_engine, trainer.critic.engine]
    record: dict[str, list[float]] = {"weights": [], "behave_logp_gap": [], "versions": []}
    record["sharded"] = [float(all(e.sharded for e in engines))]
    initial = trainer.actor_engine.state_dict_for_sync()
    while len(trainer.queue) < cfg.rollout.staleness:
        trainer.queue.append(trainer.rollout.generate_batch())
    for _ in range(STEPS):
        trainer.queue.append(trainer.rollout.generate_batch())
        batch, info = trainer.queue.popleft()
        stats = trainer._train_step(batch, info)
        assert all(k in stats for k in ("actor/loss", "critic/value_loss")), sorted(stats)
        gathered = trainer.actor_engine.state_dict_for_sync()
        record["weights"].append(
            _max_diff(trainer.rollout.engine.generator.model.state_dict(), gathered)
        )
        fresh, _ = trainer.rollout.generate_batch()
        logp, _ = trainer.actor_engine.forward_tokens(fresh, cfg.actor.temperature)
        mask = fresh["loss_mask"]
        record["behave_logp_gap"].append(
            float((logp[mask] - fresh["behave_logp"][mask]).abs().max())
        )
        stamped = fresh["versions"][mask].unique().tolist()
        record["versions"].append(float(stamped == [trainer.actor_engine.version]))
    trainer.save_hf("final")
    gathered = trainer.actor_engine.state_dict_for_sync()
    record["moved"] = [_max_diff(gathered, initial)]
    if trainer.is_main:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(f"{output_dir}/checkpoints/final")
        record["hf"] = [_max_diff(loaded.state_dict(), gathered)]
    per_rank: list[dict | None] = [None] * dist.world_size()
    torch.distributed.all_gather_object(per_rank, record)
    if trainer.is_main:
        torch.save(per_rank, out_path)
    trainer.close()
    # close() ends the run's process group (left alive, gloo can abort the exit)
    assert not torch.distributed.is_initialized(), "trainer.close() left the process group"


if __name__ == "__main__":
    main(*sys.argv[1:])
    from areal_m2po.utils.dist import exit_skipping_finalization

    exit_skipping_finalization(0)  # gloo can abort a finalising interpreter (SIGABRT)
