"""Policy weights handed to rollout servers: one safetensors directory per version.

The trainer writes ``<root>/v<version>/`` once per update: ``model.safetensors`` (metadata
``weight_version``) and the model's ``config.json``, so the directory is also what SGLang's
``/update_weights_from_disk`` loads. It is written under a temporary name and renamed into
place, so a server never sees a half-written version.

Loading is checked before anything changes (:func:`read_weights`, :func:`check_weights`): the
file is opened once, the file opened must lie below the server's ``--weights-root``, and it is
read whole from that descriptor (:mod:`.weight_reader`: no second open by path, no mapping, a
file that changes meanwhile refused); it must be a readable safetensors file; its tensors must
match the served model's names, shapes and kinds and be finite. A version is an integer in ``[0, MAX_VERSION)``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch

from areal_m2po.rollout.common.weight_reader import header_metadata, read_safetensors

__all__ = [
    "MAX_VERSION",
    "WEIGHTS_FILE",
    "check_weights",
    "check_weights_version",
    "parse_version",
    "prune_weights",
    "read_weights",
    "read_weights_of",
    "write_weights",
]

WEIGHTS_FILE = "model.safetensors"
MAX_VERSION = 2**63
"""Versions are integers in ``[0, MAX_VERSION)`` (they must fit a signed 64-bit integer)."""


def parse_version(raw: object, what: str = "weight_version") -> int:
    """``raw`` (an int or a string of decimal digits) as a version; ValueError naming ``what``
    for anything else (a bool, a float, a list, a negative or too large number)."""
    if isinstance(raw, str) and raw.isascii() and raw.isdigit() and len(raw) <= 19:
        value = int(raw)
    elif isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    else:
        shown = repr(raw) if len(repr(raw)) <= 40 else repr(raw)[:40] + "..."
        raise ValueError(f"{what}: must be an integer in [0, 2**63), got {shown}")
    if not 0 <= value < MAX_VERSION:
        raise ValueError(f"{what}: must be an integer in [0, 2**63), got {value}")
    return value


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
    """The weights file at ``path`` (a directory holding :data:`WEIGHTS_FILE`, or the file)."""
    file = os.path.join(path, WEIGHTS_FILE) if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no {WEIGHTS_FILE} at {path}")
    return file


def _stamp(meta: dict[str, str], file: str) -> int | None:
    stamp = meta.get("weight_version")
    return parse_version(stamp, f"{file}: weight_version") if stamp is not None else None


def read_weights(path: str, root: str | None = None) -> tuple[dict[str, torch.Tensor], int | None]:
    """The tensors of a weights directory (or file) and the version stamped in it (or None),
    read whole from one open descriptor (:func:`~.weight_reader.read_safetensors`).

    With ``root``, the file opened (symlinks resolved) must lie below it (PermissionError). A
    file safetensors cannot read, or one that changes while it is read, is a ValueError
    naming it.
    """
    file = _weights_file(path)
    read = read_safetensors(file, root)
    return read.tensors, _stamp(read.metadata, file)


def check_weights(
    state: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    where: str,
    optional: frozenset[str] = frozenset(),
) -> None:
    """Refuse (ValueError naming ``where`` and the tensor) weights that cannot replace
    ``reference`` whole: a name it lacks, a missing name (other than ``optional`` ones, e.g. a
    tied head), another shape, a floating tensor for an integer one or back, or a value that
    is not finite."""
    unknown = sorted(set(state) - set(reference))
    if unknown:
        raise ValueError(f"{where}: tensor {unknown[0]!r} is not a tensor of the served model")
    missing = sorted(set(reference) - set(state) - optional)
    if missing:
        raise ValueError(f"{where}: no value for {len(missing)} tensors (e.g. {missing[0]!r})")
    for name, value in state.items():
        own = reference[name]
        if tuple(value.shape) != tuple(own.shape):
            raise ValueError(
                f"{where}: tensor {name!r} has shape {list(value.shape)}, the model's is "
                f"{list(own.shape)}"
            )
        if value.dtype.is_floating_point != own.dtype.is_floating_point:
            raise ValueError(f"{where}: tensor {name!r} is {value.dtype}, the model's {own.dtype}")
        if value.dtype.is_floating_point and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{where}: tensor {name!r} holds NaN or infinite values")


def check_weights_version(path: str, version: int) -> None:
    """Raise (without loading the tensors) when the weights at ``path`` are missing or stamped
    with another version than ``version``."""
    file = _weights_file(path)
    stamp = _stamp(header_metadata(file), file)
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
