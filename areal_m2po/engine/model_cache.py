"""A model folder built once per cache directory, safe when many processes ask for it at once.

:func:`materialise` returns a complete folder (config, weights, tokenizer: :data:`REQUIRED_FILES`)
at ``target``. When it is missing, one process builds it under a file lock beside it
(``<cache>/.<name>.lock``, ``filelock``: an OS lock, released when its holder dies) into a
temporary folder next to it, checks it is complete, and renames it into place (one atomic
``rename``), so a reader sees either no folder or a complete one. The other processes (ranks of
one launch, other runs, other nodes sharing the cache) wait for the lock and load what it built.
A folder at ``target`` that lacks a required file (left by an interrupted or older build) is
replaced, with a one-line warning.

:func:`save_model_folder` writes a model and its tokenizer without ``save_pretrained``'s
process-group logic: under an initialised ``torch.distributed`` group, ``save_pretrained`` on a
rank other than 0 writes neither ``config.json`` nor the weights, and a build may run on any rank.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("areal_m2po.engine")

WEIGHTS_FILE = "model.safetensors"
REQUIRED_FILES = ("config.json", WEIGHTS_FILE, "tokenizer_config.json", "tokenizer.json")
"""The files a built model folder must hold before it is published."""


def missing_files(folder: Path) -> list[str]:
    """The :data:`REQUIRED_FILES` that ``folder`` lacks (all of them when it does not exist)."""
    return [name for name in REQUIRED_FILES if not (folder / name).is_file()]


def lock_path(target: Path) -> Path:
    """The lock file of ``target``'s build: ``.<name>.lock`` beside it."""
    return target.parent / f".{target.name}.lock"


def materialise(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """``target``, built by ``build(folder)`` first unless it is complete already.

    Args:
        target: where the finished folder lives.
        build: writes the model into the (empty, existing) folder it is given.
        what: the model's name in log lines (e.g. ``builtin:tiny``).

    Raises:
        RuntimeError: ``build`` left a required file unwritten (nothing is published).
    """
    if not missing_files(target):
        return target
    from filelock import FileLock, Timeout

    target.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path(target)))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.info("waiting for another process to build %s into %s", what, target)
        lock.acquire()
    try:
        missing = missing_files(target)
        if not missing:  # built by the process that held the lock
            return target
        if target.exists():
            logger.warning(
                "%s: the cached folder %s is incomplete (no %s); rebuilding it",
                what,
                target,
                ", ".join(missing),
            )
            _discard(target)
        logger.info("building %s into %s", what, target)
        _build_and_publish(target, build, what)
    finally:
        lock.release()
    return target


def _build_and_publish(target: Path, build: Callable[[Path], None], what: str) -> None:
    """``build`` into a temporary folder beside ``target``, then rename it to ``target``."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.build-", dir=target.parent))
    try:
        build(tmp)
        missing = missing_files(tmp)
        if missing:
            raise RuntimeError(f"building {what} wrote no {', '.join(missing)} (in {tmp})")
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _discard(folder: Path) -> None:
    """Move ``folder`` out of the way (one rename), then delete it."""
    trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
    os.replace(folder, trash / folder.name)
    shutil.rmtree(trash, ignore_errors=True)


def unique_state_dict(model: Any) -> dict[str, Any]:
    """``model.state_dict()`` with each tensor once: of names sharing storage (tied
    embeddings), the first in module order is kept, as ``save_pretrained`` keeps the input
    embedding and drops the tied ``lm_head.weight``. Tensors are made contiguous."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous()
    return out


def save_model_folder(model: Any, tokenizer: Any, folder: Path) -> None:
    """Write ``model`` (a transformers ``PreTrainedModel``: ``config.json``,
    ``generation_config.json``, ``model.safetensors``) and ``tokenizer`` into ``folder`` the
    same way on every rank, whether or not a process group is initialised."""
    from safetensors.torch import save_file

    config = model.config
    config.architectures = [type(model).__name__]
    config.dtype = str(next(model.parameters()).dtype).split(".")[1]
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    save_file(unique_state_dict(model), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    tokenizer.save_pretrained(folder)
