"""Recover checkpoint directories: atomic writes, listing, pruning and the checks of their
metadata, on plain dicts and tensors (what is in them is the trainer's business:
:meth:`areal_m2po.trainer.rl_trainer.RLTrainer.state_dict`).

A checkpoint is a directory ``<output_dir>/recover/step_<N>/`` holding one ``torch.save`` file
per part of the state and ``meta.json`` (format, step, world size, file list, the config items
that must not change), written last. Writing is atomic: the files go to a temporary directory
(:func:`new_checkpoint_dir`; sharded engines write their shards into it from every rank) that
:func:`write_checkpoint` renames to ``step_<N>`` once complete, so a crash mid-write leaves the
previous checkpoint loadable, and only complete ``step_<N>`` directories are ever listed. The
last ``keep_last`` are kept. Loading (:func:`read_meta`, :func:`load_files`) names the file that
is missing, corrupt or does not match the run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from areal_m2po.api.errors import RunError

__all__ = [
    "FORMAT_VERSION",
    "RecoverError",
    "capture_rng",
    "check_steps_left",
    "checkpoint_to_resume",
    "install_sigterm_handler",
    "latest_checkpoint",
    "list_checkpoints",
    "load_files",
    "new_checkpoint_dir",
    "read_meta",
    "recover_root",
    "restore_rng",
    "write_checkpoint",
]

# 2: the trainer's state from RLTrainer.state_dict (the actor's warning state under
#    trainer.pt["actor"]); 1 had it in flat trainer.pt keys
FORMAT_VERSION = 2
_STEP_PREFIX = "step_"
_TMP_PREFIX = ".tmp-"
_OLD_PREFIX = ".old-"
META = "meta.json"


class RecoverError(RunError):
    """A recover checkpoint is missing, unreadable or does not match this run."""


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
    np_state = np.random.get_state(legacy=True)
    if not isinstance(np_state, tuple):  # legacy=True: a tuple for numpy's MT19937
        raise RunError(f"numpy's global generator is not MT19937: {np_state.get('bit_generator')}")
    name, keys, pos, has_gauss, cached = np_state
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


# -------------------------------------------------------------------------------------- save
def new_checkpoint_dir(root: str, step: int) -> str:
    """A fresh temporary directory for the checkpoint of ``step`` under ``root`` (leftovers of
    a crash mid-write removed); :func:`write_checkpoint` completes it."""
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):  # leftovers of a crash mid-write
        if name.startswith((_TMP_PREFIX, _OLD_PREFIX)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tmp = os.path.join(root, f"{_TMP_PREFIX}{_STEP_PREFIX}{step}-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    return tmp


def write_checkpoint(
    tmp: str,
    step: int,
    files: Mapping[str, Any],
    meta: Mapping[str, Any],
    keep_last: int,
    remove: Iterable[str] = (),
) -> str:
    """Write ``files`` (name -> object for ``torch.save``) and ``meta.json`` into ``tmp`` (from
    :func:`new_checkpoint_dir`; it may already hold shard directories), rename it to
    ``step_<step>``, delete the directories ``remove`` and all but the last ``keep_last``
    checkpoints. ``meta`` (JSON) gets ``format``, ``step`` and ``files`` added. Returns the
    checkpoint's path; on any failure ``tmp`` is removed and the previous checkpoints stay."""
    root = os.path.dirname(tmp)
    path = os.path.join(root, f"{_STEP_PREFIX}{step}")
    meta = {**meta, "format": FORMAT_VERSION, "step": step}
    _write_atomically(root, tmp, path, dict(files), meta)
    for old in remove:
        shutil.rmtree(old, ignore_errors=True)
    _prune(root, keep_last)
    return path


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
def checkpoint_to_resume(root: str, mode: str) -> str | None:
    """The checkpoint ``recover.mode`` says to load: the latest under ``root`` for ``auto`` and
    ``resume``, none for ``disabled`` (or when there is none).

    Raises:
        RecoverError: ``mode`` is ``resume`` and ``root`` holds no checkpoint.
    """
    path = latest_checkpoint(root)
    if mode == "resume" and path is None:
        raise RecoverError(
            f"recover.mode=resume but there is no recover checkpoint in {root}; "
            "use recover.mode=auto to start fresh when there is none"
        )
    return None if mode == "disabled" else path


def read_meta(path: str, world_size: int, config: Mapping[str, Any]) -> dict[str, Any]:
    """``meta.json`` of the checkpoint ``path``, checked against this run: its format, its
    number of processes (``world_size``) and the config items that must not change (``config``,
    dotted key -> value; keys the checkpoint lacks are not compared).

    Raises:
        RecoverError: one line naming ``meta.json`` and what differs.
    """
    meta_path = os.path.join(path, META)
    try:
        with open(meta_path) as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RecoverError(
            f"recover checkpoint file {meta_path} is corrupt or unreadable ({_first_line(exc)})"
        ) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise RecoverError(
            f"recover checkpoint file {meta_path} has format {found!r} (an older areal_m2po); "
            f"this version reads format {FORMAT_VERSION}: start afresh there with "
            "overwrite_output_dir=true, or choose another output_dir"
        )
    if meta.get("world_size") != world_size:
        raise RecoverError(
            f"recover checkpoint {meta_path} was written by {meta.get('world_size')} processes "
            f"but this run has {world_size}; resume with the same number of processes"
        )
    saved = meta.get("config", {})
    diffs = [
        f"{k}={saved[k]!r} (now {v!r})" for k, v in config.items() if k in saved and saved[k] != v
    ]
    if diffs:
        raise RecoverError(
            f"recover checkpoint {meta_path} belongs to a different run: " + ", ".join(diffs)
        )
    return meta


def check_steps_left(path: str, meta: Mapping[str, Any], total: Any) -> None:
    """Refuse the checkpoint ``path`` (``meta``: its ``meta.json``) when its step is past
    ``total`` (``total_train_steps``; None: set by epochs): resuming would train nothing and
    save its policy as the run's final model, exit 0. At ``total`` it is a finished run.

    Raises:
        RecoverError: one line naming the step and ``total_train_steps``.
    """
    step = meta.get("step")
    if isinstance(step, int) and isinstance(total, int) and step > total:
        raise RecoverError(
            f"recover checkpoint {path} is at step {step}, past total_train_steps={total}: "
            f"resuming would train nothing; set total_train_steps above {step} to continue "
            "that run"
        )


def load_files(path: str, loaders: Sequence[tuple[str, Callable[[Any], None]]]) -> None:
    """For each ``(file name, load)`` in order: read the file of the checkpoint ``path`` and
    hand its object to ``load`` (one file in memory at a time).

    Raises:
        RecoverError: naming the file that is missing, corrupt, or whose ``load`` failed (its
            content does not match this run).
    """
    for name, load in loaders:
        file = os.path.join(path, name)
        state = _read(file)
        try:
            load(state)
        except RecoverError:
            raise
        except Exception as exc:  # noqa: BLE001 - a mismatch names the file
            raise RecoverError(
                f"recover checkpoint file {file} does not match this run "
                f"({type(exc).__name__}: {_first_line(exc)})"
            ) from exc


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
