"""The distributed side of recover checkpoints: which checkpoint every rank loads, which rank
writes what, and the per-rank parts gathered into one file.

A checkpoint holds one file per part of the trainer's state (``<part>.pt``, rank 0's copy; see
:meth:`areal_m2po.trainer.rl_trainer.RLTrainer.state_dict`), ``ranks.pt`` with every rank's
``rank`` part (RNG states, staleness queue) in rank order, and the shard directories that
sharded engines write from every rank. A checkpoint loads on the same number of processes only;
loading needs every file readable by every rank (a shared filesystem on several nodes). The
directory I/O (atomic rename, pruning, meta checks) is :mod:`areal_m2po.utils.recover`'s.

``metrics.jsonl`` is truncated to the steps <= N on resume (:meth:`StatsLogger.start`), and the
wandb run id lives in the output directory, so logs continue without duplicates or gaps.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

from areal_m2po.api.cli_args import DPOConfig, PPOConfig, SFTConfig
from areal_m2po.utils import dist, recover
from areal_m2po.utils.config_changes import config_record

__all__ = ["PartLoaders", "RecoverCheckpoints"]

logger = logging.getLogger("areal_m2po.recover")

PartLoaders = Sequence[tuple[str, Callable[[Any], None]]]
"""``(part, load)`` in load order; the per-rank part is called ``rank`` and comes last."""

# config items a resumed run must share with the run that wrote the checkpoint (anything else,
# e.g. total_train_steps, may change)
MUST_MATCH = (
    "seed",
    "actor.path",
    "critic.enabled",
    "gconfig.n_samples",
    "rollout.staleness",
    "train_dataset.path",
    "train_dataset.batch_size",
    "train_dataset.shuffle",
)

_RANK_PART = "rank"
_RANKS_FILE = "ranks.pt"


class RecoverCheckpoints:
    """The recover checkpoints of one run, under ``<output_dir>/recover``.

    Args:
        config: the run's config (its ``recover`` section and the ``must_match`` items).
        output_dir: the run's output directory.
        is_main: whether this is rank 0 (it chooses, lists and writes).
        must_match: dotted config keys (scalar values) a resumed run must share with the run
            that wrote the checkpoint (default: the PPO trainer's, :data:`MUST_MATCH`).
    """

    def __init__(
        self,
        config: PPOConfig | SFTConfig | DPOConfig,
        output_dir: str,
        is_main: bool,
        must_match: Sequence[str] = MUST_MATCH,
    ) -> None:
        self.root = recover.recover_root(output_dir)
        self.config = config.recover
        # overwrite_output_dir: start afresh whatever recover.mode says
        self.overwrite = bool(getattr(config, "overwrite_output_dir", False))
        self.mode = "disabled" if self.overwrite else self.config.mode
        self.must_match = {key: _dotted(config, key) for key in must_match}
        self.run_config = config_record(config)  # a resume compares its training keys
        self.is_main = is_main
        self.rank, self.world = dist.rank(), dist.world_size()
        self._stale: list[str] = []  # recover.mode=disabled: deleted at the first save

    def save(self, step: int, state_dict: Callable[[str], dict[str, Any]]) -> str:
        """Write the checkpoint of ``step`` from ``state_dict(shard_dir)`` (every rank calls it;
        sharded engines write into ``shard_dir``, rank 0 writes the rest). Returns its path."""
        t0 = time.perf_counter()
        tmp = recover.new_checkpoint_dir(self.root, step) if self.is_main else ""
        tmp = dist.broadcast_object(tmp)
        state = state_dict(tmp)
        ranks = dist.gather_object(state.pop(_RANK_PART))
        dist.barrier()  # every rank's shards are written
        path = os.path.join(self.root, f"step_{step}")
        if self.is_main:
            files = {f"{part}.pt": value for part, value in state.items()}
            files[_RANKS_FILE] = ranks
            meta = {
                "world_size": self.world,
                "config": self.must_match,
                "run_config": self.run_config,
                "time": time.time(),
                "shards": sorted(n for n in os.listdir(tmp) if os.path.isdir(os.path.join(tmp, n))),
            }
            keep = self.config.keep_last
            path = recover.write_checkpoint(tmp, step, files, meta, keep, self._stale)
            self._stale = []
            logger.info("saved recover checkpoint %s (%.1fs)", path, time.perf_counter() - t0)
        dist.barrier()
        return path

    def to_resume(self) -> str | None:
        """The checkpoint ``recover.mode`` says to load, the same on every rank (rank 0's
        choice); None to start fresh (with ``disabled``, the checkpoints found are deleted at
        the first save; with ``overwrite_output_dir``, now: they belong to the run it
        replaces, and a later resume must not find them)."""
        mode = self.mode
        path = recover.checkpoint_to_resume(self.root, mode) if self.is_main else None
        path = dist.broadcast_object(path)
        if path is None and mode == "disabled" and self.is_main:
            self._stale = [p for _, p in recover.list_checkpoints(self.root)]
            if self.overwrite:
                self._remove_replaced_run()
            elif self._stale:
                logger.warning(
                    "starting fresh: the %d recover checkpoint(s) in %s are deleted at the "
                    "first checkpoint of this run",
                    len(self._stale),
                    self.root,
                )
        return path

    def _remove_replaced_run(self) -> None:
        """``overwrite_output_dir``: delete the recover checkpoints and the saved models
        (``checkpoints/step_<N>``, ``checkpoints/final``) of the run this one replaces, so that
        none of them passes for this run's."""
        saved = os.path.join(os.path.dirname(self.root), "checkpoints")
        names = os.listdir(saved) if os.path.isdir(saved) else []
        models = [
            os.path.join(saved, n) for n in names if n == "final" or re.fullmatch(r"step_\d+", n)
        ]
        for old in [*self._stale, *models]:
            shutil.rmtree(old, ignore_errors=True)
        if self._stale or models:
            logger.warning(
                "overwrite_output_dir: deleted the %d recover checkpoint(s) and %d saved "
                "model(s) of the run this one replaces",
                len(self._stale),
                len(models),
            )
        self._stale = []

    def load(self, path: str, loaders: PartLoaders) -> None:
        """Check ``path`` against this run and hand each part to its loader (this rank's entry
        of ``ranks.pt`` to the ``rank`` part's).

        Raises:
            RecoverError: naming the file that is missing, corrupt or does not match this run.
        """
        meta = recover.read_meta(path, self.world, self.must_match)
        files = [(f"{part}.pt", load) for part, load in loaders if part != _RANK_PART]
        expected = {name for name, _ in files} | {_RANKS_FILE}
        if set(meta.get("files", [])) != expected:
            raise recover.RecoverError(
                f"recover checkpoint {os.path.join(path, recover.META)} holds "
                f"{sorted(meta.get('files', []))} but this run expects {sorted(expected)}"
            )
        for part, load in loaders:
            if part == _RANK_PART:
                files.append((_RANKS_FILE, self._own_rank(load)))
        recover.load_files(path, files)
        logger.info("resumed from recover checkpoint %s (step %d)", path, meta["step"])

    def _own_rank(self, load: Callable[[Any], None]) -> Callable[[Any], None]:
        """``load`` applied to this rank's entry of a ``ranks.pt`` list."""

        def fn(ranks: list[dict[str, Any]]) -> None:
            if len(ranks) != self.world or int(ranks[self.rank]["rank"]) != self.rank:
                raise ValueError(f"holds {len(ranks)} ranks, this run has {self.world}")
            load(ranks[self.rank])

        return fn


def _dotted(obj: Any, key: str) -> Any:
    """``obj.a.b`` for ``key="a.b"``."""
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj
