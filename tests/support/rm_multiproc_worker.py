"""Run by tests/multiproc/test_reward_model_multiproc.py, alone (1 process) or under ``accelerate launch``
(2 processes): the learned reward on this rank's rows, and one train_rm step.

    python rm_multiproc_worker.py WORK_DIR OUT.pt

``WORK_DIR`` holds ``rm/`` (a saved tiny reward model) and ``pairs.jsonl`` (8 pairs), written by
the test. Rank 0 writes to ``OUT.pt``: every rank's rewards (batch-normalised over all ranks)
and the reward model's weights after one optimizer step on the 8 pairs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def main(work: str, out_path: str) -> None:
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import (
        EvaluatorConfig,
        OptimizerConfig,
        PreferenceDatasetConfig,
        RewardModelConfig,
        RWConfig,
        RWModelConfig,
        SaverConfig,
        StatsLoggerConfig,
    )
    from areal_m2po.reward.reward_model import LearnedReward
    from areal_m2po.trainer.rw_trainer import RWTrainer
    from areal_m2po.utils import dist

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank, world = dist.rank(), dist.world_size()
    prompts = [f"What is {10 + i} + {20 + i}?" for i in range(6)]
    completions = [str(30 + 2 * i + (i % 3)) for i in range(6)]
    verifiable = torch.tensor([float(i % 3 == 0) for i in range(6)])
    per = len(prompts) // world
    mine = slice(rank * per, (rank + 1) * per)
    reward = LearnedReward(
        RewardModelConfig(path=str(Path(work) / "rm"), norm="batch", verifiable_weight=0.5),
        accelerator.device,
    )
    rewards, stats = reward.rewards(prompts[mine], completions[mine], verifiable[mine])

    cfg = RWConfig(
        seed=0,
        output_dir=str(Path(work) / f"run{world}"),
        total_train_steps=1,
        # SGD: the update is linear in the gradient (Adam's first step, g / |g|, turns float
        # noise in near-zero gradients into full-size steps)
        model=RWModelConfig(
            path=str(Path(work) / "rm"), optimizer=OptimizerConfig(type="sgd", lr=0.5, beta1=0.0)
        ),
        train_dataset=PreferenceDatasetConfig(
            path=str(Path(work) / "pairs.jsonl"), batch_size=8, shuffle=False
        ),
        evaluator=EvaluatorConfig(eval_at_start=False, eval_at_end=False, freq_steps=None),
        saver=SaverConfig(save_at_end=False),
        stats_logger=StatsLoggerConfig(console=False, progress_bar=False),
    )
    trainer = RWTrainer(cfg)
    train_stats = trainer.train_step(trainer._local_rows(trainer.loader.next_batch()[0]))
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    gathered: list = [None] * world
    if world > 1:
        torch.distributed.all_gather_object(gathered, rewards)
    else:
        gathered = [rewards]
    if rank == 0:
        torch.save(
            {
                "world": world,
                "rewards": torch.cat(gathered),
                "stats": stats,
                "train_stats": train_stats,
                "state": state,
            },
            out_path,
        )
    trainer.close()
    # close() ends the run's process group (left alive, gloo can abort the exit)
    assert not torch.distributed.is_initialized(), "trainer.close() left the process group"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    from areal_m2po.utils.dist import exit_skipping_finalization

    exit_skipping_finalization(0)  # gloo can abort a finalising interpreter (SIGABRT)
