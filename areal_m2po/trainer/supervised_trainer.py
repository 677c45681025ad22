"""What the supervised trainers (SFT, reward model, DPO) share: their start-up, data, step,
held-out chunks and recover state.

Start-up, in order: the config's required fields (``check_required``, when the config has
them), the run (:func:`~areal_m2po.trainer.run_setup.start_run`), the launch checks of the
trained ``model`` section (:attr:`SupervisedTrainer.checks_launch`), the data (tokenizer,
train and held-out items, the batch split over ranks), the model (:meth:`_build_model`), the
metrics sinks and, for a trainer that resumes, its recover checkpoints. One step trains on this
rank's rows of the loader's next batch and records the epoch as ``<prefix>/epoch``; the loop,
evaluation cadence, saves, recover checkpoints and SIGTERM are :mod:`~areal_m2po.trainer.step_loop`'s.

A trainer says what differs: how items load and collate, the tokenizer (a reward model's
has its own), the model, one step's metrics (:meth:`train_step`), :meth:`evaluate` and its
start-up line (:meth:`_begin`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

from areal_m2po.trainer.checkpoints import RecoverCheckpoints
from areal_m2po.trainer.preflight import check_batch_split, check_engine_launch
from areal_m2po.trainer.run_setup import make_stats_logger, released_on_failure, start_run
from areal_m2po.trainer.step_loop import RecoverableStepLoop, StepLoop, epoch_loader
from areal_m2po.utils import recover
from areal_m2po.utils.data import Batch

__all__ = ["RecoverableSupervisedTrainer", "SupervisedTrainer"]


class SupervisedTrainer(StepLoop):
    """A trainer of one ``model`` section on a dataset of items (examples or pairs).

    Class attributes a trainer sets:
        metric_prefix: its metrics' prefix (``sft``, ``train``, ``dpo``): the step's epoch is
            ``<prefix>/epoch``.
        checks_launch: run the launch checks of ``model`` (backend, devices, precision) first.
        even_batches: several processes need ``train_dataset.drop_last`` (the rows of a global
            batch are dealt to the ranks one by one, and an uneven last batch would not split).
    """

    metric_prefix: str = ""
    checks_launch: bool = True
    even_batches: bool = True
    engine: Any
    train_items: list[Any]
    valid_items: list[Any]

    def __init__(self, config: Any) -> None:
        self.config = cfg = config
        if hasattr(cfg, "check_required"):
            cfg.check_required()
        ctx = start_run(cfg)
        self.accelerator, self.is_main = ctx.accelerator, ctx.is_main
        self.rank, self.world, self.output_dir = ctx.rank, ctx.world, ctx.output_dir
        self.run_lock = ctx.lock
        with released_on_failure(ctx.lock):
            if self.checks_launch:
                check_engine_launch(
                    [("model", cfg.model)],
                    self.accelerator.distributed_type.value,
                    self.world,
                    torch.cuda.is_available(),
                    str(self.accelerator.mixed_precision),
                )
            self._build_data()
            self._build_model()
            self.stats_logger = make_stats_logger(cfg, ctx)
            self._build_checkpoints()
        self.step = 0
        self.stop_requested = False

    # -- construction (what a trainer overrides) ----------------------------------------------

    def _load_tokenizer(self) -> Any:
        """The tokenizer of ``tokenizer_path`` (null: ``model.path``), padding with EOS when it
        has no pad token."""
        from transformers import AutoTokenizer

        from areal_m2po.engine.builtin_models import resolve_model_path

        cfg = self.config
        tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(cfg.tokenizer_path or cfg.model.path)
        )
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    def _load_items(self, dataset: Any) -> list[Any]:
        """The tokenized items of one dataset section."""
        raise NotImplementedError

    def _collate(self, items: list[Any]) -> Batch:
        """The engine's batch of ``items``."""
        raise NotImplementedError

    def _build_model(self) -> None:
        """Set ``self.engine`` (and what else the model needs)."""
        raise NotImplementedError

    def _build_checkpoints(self) -> None:
        """Recover checkpoints (none here; :class:`RecoverableSupervisedTrainer`)."""

    def _build_data(self) -> None:
        cfg = self.config
        self.tokenizer = self._load_tokenizer()
        self.train_items = self._load_items(cfg.train_dataset)
        valid = cfg.valid_dataset
        self.valid_items = self._load_items(valid) if valid is not None else []
        check_batch_split(cfg.train_dataset.batch_size, self.world)
        if self.even_batches and self.world > 1 and not cfg.train_dataset.drop_last:
            raise ValueError(
                "train_dataset.drop_last must be true with several processes (an epoch's last, "
                "smaller batch would not split evenly over the ranks)"
            )
        self.loader, self.total_steps = epoch_loader(self.train_items, cfg)

    # -- the step -----------------------------------------------------------------------------

    def _local_rows(self, items: list[Any]) -> list[Any]:
        """This rank's share of a global batch (strided; the last batch of an epoch may be
        uneven)."""
        return items[self.rank :: self.world]

    def train_step(self, items: list[Any]) -> dict[str, float]:
        """One optimizer step on this rank's ``items``; its metrics."""
        raise NotImplementedError

    def _one_step(self) -> dict[str, float]:
        batch, epoch = self.loader.next_batch()
        stats = self.train_step(self._local_rows(batch))
        stats[f"{self.metric_prefix}/epoch"] = float(epoch)
        return stats

    def _has_eval_data(self) -> bool:
        return bool(self.valid_items)

    def _eval_chunks(self) -> list[Batch]:
        """This rank's strided share of the held-out items in batches of
        ``valid_dataset.batch_size``; every rank gets as many (some possibly empty), so
        sharded engines run their forwards in step."""
        assert self.config.valid_dataset is not None
        bs = self.config.valid_dataset.batch_size
        mine = self.valid_items[self.rank :: self.world]
        n_chunks = math.ceil(math.ceil(len(self.valid_items) / self.world) / bs)
        return [self._collate(mine[i * bs : (i + 1) * bs]) for i in range(n_chunks)]

    def save_hf(self, tag: str) -> str:
        return self._save_engine_hf(self.engine, tag, "model")


class RecoverableSupervisedTrainer(SupervisedTrainer, RecoverableStepLoop):
    """A :class:`SupervisedTrainer` with recover checkpoints of its step, loader position,
    engine state and RNG (SFT, DPO).

    Class attribute a trainer sets:
        must_match: the config items a resumed run must share with the run that wrote the
            checkpoint.
    """

    must_match: tuple[str, ...] = ()

    def _build_checkpoints(self) -> None:
        self.checkpoints = RecoverCheckpoints(
            self.config, self.output_dir, self.is_main, self.must_match
        )

    def state_dict(self, shard_dir: str | None = None) -> dict[str, Any]:
        """This rank's state: ``trainer`` (step, loader position), ``model`` (the engine's
        weights, optimizer, scheduler; sharded into ``shard_dir/model_shards``), ``rank`` (RNG)."""
        shards = None if shard_dir is None else os.path.join(shard_dir, "model_shards")
        return {
            "trainer": {
                "step": self.step,
                "loader": self.loader.state_dict(),
                "skip_streaks": dict(self.skip_streaks or {}),
            },
            "model": self.engine.training_state(shards),
            "rank": {"rank": self.rank, "rng": recover.capture_rng()},
        }

    def _state_loaders(self, shard_dir: str | None) -> list[tuple[str, Callable[[Any], None]]]:
        shards = None if shard_dir is None else os.path.join(shard_dir, "model_shards")

        def load_trainer(state: Mapping[str, Any]) -> None:
            self.loader.load_state_dict(state["loader"])
            self.step = int(state["step"])
            self.skip_streaks = {k: int(v) for k, v in state.get("skip_streaks", {}).items()}

        return [
            ("trainer", load_trainer),
            ("model", lambda state: self.engine.load_training_state(state, shards)),
            ("rank", lambda state: recover.restore_rng(state["rng"])),
        ]
