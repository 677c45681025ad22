"""Full-state recover checkpoints: a run that dies continues as if nothing happened.

A checkpoint is a directory ``<output_dir>/recover/step_<N>/`` written after step ``N`` (its
metrics already in ``metrics.jsonl``)::

    meta.json     format, step, world size, file list, the config items that must not change
    trainer.pt    step, rollout count (it seeds sampling), PromptLoader position, fault counters,
                  the learned reward's running normaliser (reward.model.norm=running)
    actor.pt      policy weights, optimizer, LR scheduler, version (HFTrainEngine.training_state)
    critic.pt     the same for the critic (only with critic.enabled)
    actor_shards/ with backend fsdp2: the policy's and its optimizer's shards, written by every
                  rank with torch.distributed.checkpoint (no full gather); actor.pt then holds
                  the scheduler and version only (critic_shards/ likewise)
    rollout.pt    behaviour-policy version, and its weights when they differ from the policy's
    ranks.pt      per rank: every RNG (python, numpy, torch, CUDA) and the staleness queue

Every rank takes part (the state of a sharded model is a collective; RNG and queue are per
rank); rank 0 writes, except the shards, which every rank writes into the same temporary
directory. A checkpoint loads on the same number of processes only. Writing is atomic: the files go to a temporary directory that is renamed
to ``step_<N>`` once complete, so a crash mid-write leaves the previous checkpoint loadable
(and only complete ``step_<N>`` directories are ever read). The last ``recover.keep_last`` are
kept. Loading needs every file readable by every rank (a shared filesystem on several nodes).

``metrics.jsonl`` is truncated to the steps <= N on resume (:meth:`StatsLogger.start`), and the
wandb run id lives in the output directory, so logs continue without duplicates or gaps.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from areal_m2po.utils import dist

if TYPE_CHECKING:
    from areal_m2po.trainer.rl_trainer import RLTrainer

__all__ = [
    "NonFiniteTrainingError",
    "RecoverError",
    "capture_rng",
    "install_sigterm_handler",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "maybe_resume",
    "recover_root",
    "restore_rng",
    "save_checkpoint",
]

logger = logging.getLogger("areal_m2po.recover")

FORMAT_VERSION = 1
_STEP_PREFIX = "step_"
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"
META = "meta.json"

# config items a resumed run must share with the run that wrote the checkpoint (anything else,
# e.g. total_train_steps, may change)
_MUST_MATCH = (
    "seed",
    "actor.path",
    "critic.enabled",
    "gconfig.n_samples",
    "rollout.staleness",
    "train_dataset.path",
    "train_dataset.batch_size",
    "train_dataset.shuffle",
)


class RecoverError(RuntimeError):
    """A recover checkpoint is missing, unreadable or does not match this run."""


class NonFiniteTrainingError(RuntimeError):
    """Too many consecutive training steps were skipped for a non-finite loss or gradient."""


# ------------------------------------------------------------------------------------- paths
def recover_root(output_dir: str) -> str:
    return os.path.join(output_dir, "recover")


def list_checkpoints(root: str) -> list[tuple[int, str]]:
    """``(step, path)`` of the complete checkpoints under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        if not name.startswith(_STEP_PREFIX):
            continue
        try:
            step = int(name[len(_STEP_PREFIX) :])
        except ValueError:
            continue
        path = os.path.join(root, name)
        if os.path.isfile(os.path.join(path, META)):
            found.append((step, path))
    return sorted(found)


def latest_checkpoint(root: str) -> str | None:
    found = list_checkpoints(root)
    return found[-1][1] if found else None


# --------------------------------------------------------------------------------------- RNG
def capture_rng() -> dict[str, Any]:
    """This process's python, numpy, torch and CUDA generator states (torch.load-safe types)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (str(name), keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(_as_tuples(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(x: Any) -> Any:
    """``random.setstate`` wants tuples all the way down."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------------------------- file I/O
def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write(obj: Any, path: str) -> None:
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def _read(path: str) -> Any:
    if not os.path.isfile(path):
        raise RecoverError(f"recover checkpoint file {path} is missing")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read is one clear error
        raise RecoverError(
            f"recover checkpoint file {path} is corrupt or unreadable "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from exc


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def _config_items(trainer: RLTrainer) -> dict[str, Any]:
    out = {}
    for key in _MUST_MATCH:
        obj: Any = trainer.config
        for part in key.split("."):
            obj = getattr(obj, part)
        out[key] = obj
    return out


# -------------------------------------------------------------------------------------- save
def _same_weights(a: dict[str, torch.Tensor], b: Iterable[tuple[str, torch.Tensor]]) -> bool:
    """Whether ``b`` (consumed to the end: it may be a collective gather) equals ``a``."""
    same, seen = True, set()
    for k, v in b:
        seen.add(k)
        same = same and k in a and torch.equal(a[k].cpu(), v.cpu())
    return same and seen == set(a)


def _engine_state(engine: Any, tmp: str, name: str) -> tuple[dict[str, Any], str | None]:
    """An engine's training state; a sharded one writes its shards into ``tmp/<name>``."""
    if not engine.sharded:
        return engine.training_state(), None
    return engine.training_state(shard_dir=os.path.join(tmp, name)), name


def save_checkpoint(trainer: RLTrainer) -> str:
    """Write the full state after ``trainer.step``; every rank calls it. Returns the path."""
    cfg = trainer.config
    root = recover_root(trainer.output_dir)
    step = trainer.step
    t0 = time.perf_counter()
    path = os.path.join(root, f"{_STEP_PREFIX}{step}")
    tmp = _new_tmp(root, path) if trainer.is_main else ""
    if dist.is_distributed():  # sharded engines write into rank 0's temporary directory
        box = [tmp]
        torch.distributed.broadcast_object_list(box, src=0)
        tmp = box[0]
    shards: list[str] = []
    actor_state, shard = _engine_state(trainer.actor_engine, tmp, "actor_shards")
    shards += [shard] if shard else []
    critic_state = None
    if trainer.critic is not None:
        critic_state, shard = _engine_state(trainer.critic.engine, tmp, "critic_shards")
        shards += [shard] if shard else []
    rollout_weights = trainer.rollout.model.state_dict()
    same = trainer.rollout.version == trainer.actor_engine.version and _same_weights(
        rollout_weights, trainer.actor_engine.full_tensors()
    )
    rollout_state = {
        "version": trainer.rollout.version,
        "weights": None if same else {k: v.cpu() for k, v in rollout_weights.items()},
    }
    mine = {"rank": trainer.rank, "rng": capture_rng(), "queue": list(trainer.queue)}
    if dist.is_distributed():
        ranks: list[Any] | None = [None] * trainer.world if trainer.is_main else None
        torch.distributed.gather_object(mine, ranks, dst=0)
    else:
        ranks = [mine]
    dist.barrier()  # every rank's shards are written
    if trainer.is_main:
        assert ranks is not None
        _write_atomically(
            root,
            tmp,
            path,
            {
                "trainer.pt": {
                    "step": step,
                    "n_rollouts": trainer.n_rollouts,
                    "loader": trainer.loader.state_dict(),
                    "consecutive_skipped": getattr(trainer, "consecutive_skipped", 0),
                    "actor_high_mask_streak": trainer.actor._high_mask_streak,
                    "actor_warned_no_m2po": trainer.actor._warned_no_m2po,
                    **(
                        {"learned_reward": trainer.learned_reward.state_dict()}
                        if getattr(trainer, "learned_reward", None) is not None
                        else {}
                    ),
                },
                "actor.pt": actor_state,
                **({"critic.pt": critic_state} if critic_state is not None else {}),
                "rollout.pt": rollout_state,
                "ranks.pt": ranks,
            },
            {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": trainer.world,
                "config": _config_items(trainer),
                "time": time.time(),
                "shards": shards,
            },
        )
        stale = getattr(trainer, "_stale_recover", None) or []
        for _, old in stale:
            shutil.rmtree(old, ignore_errors=True)
        trainer._stale_recover = []
        _prune(root, cfg.recover.keep_last)
        logger.info("saved recover checkpoint %s (%.1fs)", path, time.perf_counter() - t0)
    dist.barrier()
    return path


def _new_tmp(root: str, path: str) -> str:
    """A fresh temporary directory for the checkpoint ``path`` (leftovers of a crash removed)."""
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # leftovers of a crash mid-write
        if name.startswith((_TMP_PREFIX, _OLD_PREFIX)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tmp = os.path.join(root, f"{_TMP_PREFIX}{os.path.basename(path)}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    return tmp


def _write_atomically(
    root: str, tmp: str, path: str, files: dict[str, Any], meta: dict[str, Any]
) -> None:
    """Write ``files`` and then ``meta.json`` into ``tmp`` and rename it to ``path``."""
    try:
        for name, obj in files.items():
            _write(obj, os.path.join(tmp, name))
        meta = {**meta, "files": sorted(files)}
        with open(os.path.join(tmp, META), "w") as fh:  # written last: marks it complete
            json.dump(meta, fh, indent=1, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if os.path.exists(path):  # e.g. a run restarted from an older checkpoint
            old = os.path.join(root, f"{_OLD_PREFIX}{os.path.basename(path)}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _prune(root: str, keep_last: int) -> None:
    found = list_checkpoints(root)
    for _, path in found[: max(len(found) - keep_last, 0)]:
        shutil.rmtree(path, ignore_errors=True)


# -------------------------------------------------------------------------------------- load
def load_checkpoint(trainer: RLTrainer, path: str) -> None:
    """Restore the full state written by :func:`save_checkpoint` (every rank calls it).

    Raises:
        RecoverError: naming the file that is missing, corrupt or does not match this run.
    """
    meta_path = os.path.join(path, META)
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RecoverError(
            f"recover checkpoint file {meta_path} is corrupt or unreadable ({_first_line(exc)})"
        ) from exc
    if meta.get("format") != FORMAT_VERSION:
        raise RecoverError(
            f"recover checkpoint file {meta_path} has format {meta.get('format')!r}; this "
            f"version reads format {FORMAT_VERSION}"
        )
    if meta.get("world_size") != trainer.world:
        raise RecoverError(
            f"recover checkpoint {meta_path} was written by {meta.get('world_size')} processes "
            f"but this run has {trainer.world}; resume with the same number of processes"
        )
    saved_cfg = meta.get("config", {})
    current = _config_items(trainer)
    diffs = [
        f"{k}={saved_cfg[k]!r} (now {current[k]!r})"
        for k in current
        if k in saved_cfg and saved_cfg[k] != current[k]
    ]
    if diffs:
        raise RecoverError(
            f"recover checkpoint {meta_path} belongs to a different run: " + ", ".join(diffs)
        )
    files = set(meta.get("files", []))
    if (trainer.critic is not None) != ("critic.pt" in files):
        raise RecoverError(
            f"recover checkpoint {meta_path}: critic.enabled differs from the run that wrote it"
        )

    def apply(name: str, fn: Callable[[Any], None]) -> None:
        file = os.path.join(path, name)
        state = _read(file)
        try:
            fn(state)
        except RecoverError:
            raise
        except Exception as exc:  # noqa: BLE001 - a mismatch names the file
            raise RecoverError(
                f"recover checkpoint file {file} does not match this run "
                f"({type(exc).__name__}: {_first_line(exc)})"
            ) from exc

    def load_trainer(state: dict[str, Any]) -> None:
        trainer.loader.load_state_dict(state["loader"])
        trainer.step = int(state["step"])
        trainer.n_rollouts = int(state["n_rollouts"])
        trainer.consecutive_skipped = int(state.get("consecutive_skipped", 0))
        trainer.actor._high_mask_streak = int(state.get("actor_high_mask_streak", 0))
        trainer.actor._warned_no_m2po = bool(state.get("actor_warned_no_m2po", False))
        learned = getattr(trainer, "learned_reward", None)
        if learned is not None and "learned_reward" in state:  # its running normaliser
            learned.load_state_dict(state["learned_reward"])

    def load_rollout(state: dict[str, Any]) -> None:
        weights = state["weights"]
        if weights is None:
            weights = trainer.actor_engine.state_dict_for_sync()
        trainer.rollout.update_weights(weights, int(state["version"]))

    def load_rank(state: list[dict[str, Any]]) -> None:
        mine = state[trainer.rank]
        if len(state) != trainer.world or int(mine["rank"]) != trainer.rank:
            raise ValueError(f"holds {len(state)} ranks, this run has {trainer.world}")
        queue = [(batch, info) for batch, info in mine["queue"]]
        if len(queue) != trainer.config.rollout.staleness:
            raise ValueError(
                f"holds {len(queue)} queued rollout batches, rollout.staleness is "
                f"{trainer.config.rollout.staleness}"
            )
        trainer.queue.clear()
        trainer.queue.extend(queue)
        restore_rng(mine["rng"])

    apply("trainer.pt", load_trainer)

    def load_engine(engine: Any, name: str) -> Callable[[Any], None]:
        def fn(state: dict[str, Any]) -> None:
            engine.load_training_state(state, shard_dir=os.path.join(path, name))

        return fn

    apply("actor.pt", load_engine(trainer.actor_engine, "actor_shards"))
    if trainer.critic is not None:
        apply("critic.pt", load_engine(trainer.critic.engine, "critic_shards"))
    apply("rollout.pt", load_rollout)
    apply("ranks.pt", load_rank)  # last: the RNG state is the one the writer had
    logger.info("resumed from recover checkpoint %s (step %d)", path, trainer.step)


def maybe_resume(trainer: RLTrainer) -> bool:
    """Resume as ``recover.mode`` says; True when a checkpoint was loaded."""
    mode = trainer.config.recover.mode
    root = recover_root(trainer.output_dir)
    path = None
    if trainer.is_main:
        path = latest_checkpoint(root)
    if dist.is_distributed():  # every rank loads the checkpoint rank 0 chose
        box = [path]
        torch.distributed.broadcast_object_list(box, src=0)
        path = box[0]
    if mode == "disabled" or path is None:
        if mode == "resume":
            raise RecoverError(
                f"recover.mode=resume but there is no recover checkpoint in {root}; "
                "use recover.mode=auto to start fresh when there is none"
            )
        if path is not None and trainer.is_main:
            stale = list_checkpoints(root)
            logger.warning(
                "recover.mode=disabled: starting fresh; the %d recover checkpoint(s) in %s are "
                "deleted at the first checkpoint of this run",
                len(stale),
                root,
            )
            trainer._stale_recover = stale
        return False
    load_checkpoint(trainer, path)
    return True


# -------------------------------------------------------------------------------- SIGTERM
def install_sigterm_handler(on_signal: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_signal`` on SIGTERM instead of dying; returns a function restoring the old
    handler. A no-op outside the main thread (signals are only delivered there)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        on_signal()

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
