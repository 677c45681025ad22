"""Run by tests/multiproc/test_dpo_multiproc.py, alone (1 process) or under ``accelerate
launch`` (2 processes): one DPO step of the tiny model on a fixed batch of 8 pairs.

    python dpo_multiproc_worker.py DATA.jsonl OUT_DIR OUT.pt [KEY=VALUE ...]

The overrides go to the :class:`DPOConfig` (e.g. ``model.backend=fsdp2``, ``model.lora.r=4``).
Rank 0 writes to ``OUT.pt``: the step's stats, the held-out stats (7 pairs: uneven shares per
rank) and the full model weights after the step (merged with the adapter when LoRA is on); the
run also writes its HF save (``OUT_DIR/checkpoints/final``) and a recover checkpoint.
"""

from __future__ import annotations

import sys

import torch


def main(data: str, out_dir: str, out_path: str, overrides: list[str]) -> None:
    from areal_m2po.api.cli_args import DPOConfig
    from areal_m2po.api.config_loader import load_config
    from areal_m2po.trainer.dpo_trainer import DPOTrainer
    from areal_m2po.utils import dist

    torch.set_num_threads(1)
    cfg = load_config(
        [
            "seed=0",
            f"output_dir={out_dir}",
            "total_train_steps=1",
            "model.path=builtin:tiny",
            "beta=0.5",
            # SGD: the update is linear in the gradient (Adam's first step turns float noise
            # in near-zero gradients into full-size steps)
            "model.optimizer.type=sgd",
            "model.optimizer.lr=0.5",
            "model.optimizer.beta1=0.0",
            f"train_dataset.path={data}",
            "train_dataset.batch_size=8",
            "train_dataset.shuffle=false",
            f"valid_dataset.path={data}",
            "valid_dataset.batch_size=3",
            "valid_dataset.max_samples=7",
            "saver.save_at_end=false",
            "stats_logger.console=false",
            "stats_logger.progress_bar=false",
            *overrides,
        ],
        DPOConfig,
    )
    trainer = DPOTrainer(cfg)
    stats = trainer.train_step(trainer._local_rows(trainer.loader.next_batch()[0]))
    eval_stats = trainer.evaluate()
    state = {k: v.detach().cpu().clone() for k, v in trainer.engine.full_tensors()}
    trainer.save_hf("final")  # sharded: gathered to rank 0 (LoRA: the adapter + merged)
    trainer.step = 1
    trainer.save_checkpoint()  # sharded: every rank writes its shards
    if dist.rank() == 0:
        torch.save(
            {"world": dist.world_size(), "stats": stats, "eval": eval_stats, "state": state},
            out_path,
        )
    trainer.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
    from areal_m2po.utils.dist import exit_skipping_finalization

    exit_skipping_finalization(0)  # gloo can abort a finalising interpreter (SIGABRT)
