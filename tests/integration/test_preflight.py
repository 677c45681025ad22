"""Batch-split checks of a launch (trainer/preflight.py), run before any model loads."""

from __future__ import annotations

import pytest

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.trainer.preflight import check_batch_split, check_rl_batch


def _cfg(batch: int, n_minibatches: int = 1, mode: str = "sync") -> PPOConfig:
    cfg = PPOConfig()
    cfg.train_dataset.batch_size = batch
    cfg.actor.ppo_n_minibatches = n_minibatches
    cfg.rollout.mode = mode
    return cfg


@pytest.mark.parametrize(("batch", "world"), [(4, 1), (4, 2), (4, 4), (6, 3)])
def test_even_splits_pass(batch: int, world: int) -> None:
    check_batch_split(batch, world)
    check_rl_batch(_cfg(batch), world)


def test_uneven_split_names_the_key() -> None:
    with pytest.raises(ValueError, match=r"^train_dataset\.batch_size \(6\) must be a multiple"):
        check_rl_batch(_cfg(6), 4)


def test_fewer_groups_per_rank_than_minibatches() -> None:
    check_rl_batch(_cfg(8, n_minibatches=4), 2)  # 4 groups per rank: one per minibatch
    with pytest.raises(ValueError, match=r"actor\.ppo_n_minibatches \(4\) exceeds the 2 prompt"):
        check_rl_batch(_cfg(8, n_minibatches=4), 4)


def test_async_rollout_splits_the_batch_like_sync() -> None:
    check_rl_batch(_cfg(4, mode="async"), 1)
    check_rl_batch(_cfg(4, mode="async"), 2)  # each process generates and trains 2 groups
    with pytest.raises(ValueError, match=r"^train_dataset\.batch_size \(4\) must be a multiple"):
        check_rl_batch(_cfg(4, mode="async"), 3)
