"""Policy weights handed to rollout servers: one safetensors directory per version.

The trainer writes ``<root>/v<version>/`` once per update: ``model.safetensors`` (metadata
``weight_version``) and the model's ``config.json``, so the directory is also what SGLang's
``/update_weights_from_disk`` loads. It is written under a temporary name and renamed into
place, so a server never sees a half-written version.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch

__all__ = [
    "WEIGHTS_FILE",
    "check_weights_version",
    "prune_weights",
    "read_weights",
    "read_weights_of",
    "write_weights",
]

WEIGHTS_FILE = "model.safetensors"


def _version_dir(root: str, version: int) -> str:
    return os.path.join(root, f"v{version}")


def write_weights(
    state_dict: dict[str, torch.Tensor], root: str, version: int, model_config: Any = None
) -> str:
    """Write ``state_dict`` as version ``version`` under ``root``; returns the directory.

    Tensors already on the CPU and contiguous are written as they are (no copy); a tensor
    sharing storage with one before it (tied embeddings) is saved as a separate copy, as
    safetensors requires. ``model_config`` (a ``transformers`` config) is saved next to them.
    """
    from safetensors.torch import save_file

    os.makedirs(root, exist_ok=True)
    final = _version_dir(root, version)
    tmp = tempfile.mkdtemp(prefix=f".v{version}.", dir=root)
    try:
        tensors = _unshared_cpu(state_dict)
        path = os.path.join(tmp, WEIGHTS_FILE)
        save_file(tensors, path, metadata={"weight_version": str(version), "format": "pt"})
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        if model_config is not None:
            model_config.save_pretrained(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _unshared_cpu(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors, copied only where needed (off the CPU, strided, or sharing
    storage with an earlier tensor)."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, value in state_dict.items():
        t = value.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _weights_file(path: str) -> str:
    file = os.path.join(path, WEIGHTS_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no {WEIGHTS_FILE} at {path}")
    return file


def _stamp(file: str) -> int | None:
    from safetensors import safe_open

    with safe_open(file, framework="pt") as fh:
        meta = fh.metadata() or {}
    stamp = meta.get("weight_version")
    return int(stamp) if stamp is not None and stamp.isdigit() else None


def read_weights(path: str) -> tuple[dict[str, torch.Tensor], int | None]:
    """The tensors of a weights directory (or file) and the version stamped in it (or None)."""
    from safetensors.torch import load_file

    file = _weights_file(path)
    return load_file(file), _stamp(file)


def check_weights_version(path: str, version: int) -> None:
    """Raise (without loading the tensors) when the weights at ``path`` are missing or stamped
    with another version than ``version``."""
    stamp = _stamp(_weights_file(path))
    if stamp is not None and stamp != version:
        raise ValueError(f"weight version {version} != the version {stamp} stamped in {path}")


def read_weights_of(path: str, version: int) -> dict[str, torch.Tensor]:
    """The tensors of :func:`read_weights`, which are to be ``version``: ValueError when the
    directory is stamped with another version."""
    check_weights_version(path, version)
    state, _ = read_weights(path)
    return state


def prune_weights(root: str, keep_from_version: int) -> None:
    """Delete the version directories older than ``keep_from_version``."""
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        if name.startswith("v") and name[1:].isdigit() and int(name[1:]) < keep_from_version:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
