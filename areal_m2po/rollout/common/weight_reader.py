"""One safetensors file read whole from one checked file descriptor, never mapped.

A rollout server loads weights from files that another process writes, so the file may be
swapped, rewritten or cut short while it loads. :func:`read_safetensors` therefore

* opens the file once and checks *what it opened*: the descriptor's own path
  (``/proc/self/fd/N``, else the resolved path with the same device and inode) must lie below
  ``root``; a symlink swapped in after the check cannot redirect the read;
* reads every byte from that descriptor into memory (no ``mmap``: a file truncated under a
  mapping kills the process with SIGBUS) and refuses a file whose size, modification or change
  time differs after the read from before it, or that holds more or fewer bytes than it said
  (:class:`WeightFileChanged`, a ValueError: the server answers 4xx and keeps its weights);
* parses the bytes itself (the safetensors layout: an 8-byte header length, a JSON header of
  each tensor's dtype, shape and byte range, then the data): every tensor is a view of the one
  buffer read, checked to lie inside it with the size its shape says, so a load holds the file
  once in memory; the version stamp comes from the same bytes.

It imports only the standard library, torch and :mod:`.guard`, so the vLLM worker
extension uses it from vLLM's own environment.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from typing import Any

from areal_m2po.rollout.common.guard import below_root

__all__ = [
    "MAX_HEADER_BYTES",
    "WeightFile",
    "WeightFileChanged",
    "header_metadata",
    "header_shapes",
    "read_safetensors",
]

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""The largest safetensors header (its JSON), as the safetensors library allows."""
_CHUNK = 16 * 1024 * 1024


class WeightFileChanged(ValueError):
    """The file changed (size, content or identity) while it was read."""


@dataclass
class WeightFile:
    """A safetensors file as read: its tensors, metadata and the path actually opened."""

    tensors: dict[str, Any]
    metadata: dict[str, str]
    real_path: str


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _opened_path(fd: int, path: str) -> str:
    """The path of the file open at ``fd``: the kernel's name for it where ``/proc`` has one,
    else the resolved ``path`` when it is the same file (same device and inode)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
    real = os.path.realpath(path)
    mine, theirs = os.fstat(fd), os.stat(real)
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        raise WeightFileChanged(f"{path}: the file changed while it was opened")
    return real


def _read_all(fd: int, size: int, path: str) -> bytearray:
    """Exactly ``size`` bytes of ``fd`` and nothing after them, else WeightFileChanged."""
    data = bytearray(size)
    view = memoryview(data)
    done = 0
    while done < size:
        n = os.readv(fd, [view[done : done + _CHUNK]])
        if n == 0:
            raise WeightFileChanged(
                f"{path}: the file shrank while it was read ({done} of {size} bytes)"
            )
        done += n
    if os.read(fd, 1):
        raise WeightFileChanged(f"{path}: the file grew while it was read")
    return data


def _open_checked(path: str, root: str | None) -> tuple[int, str]:
    """(a read-only descriptor of ``path``, the path it opened); PermissionError when that path
    lies outside ``root``, FileNotFoundError / ValueError for a missing or non-regular file."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)  # O_NONBLOCK: a FIFO swapped in does not block the open
    try:
        real = _opened_path(fd, path)
        if root is not None and not below_root(real, root):
            raise PermissionError(f"{path} resolves outside the server's --weights-root")
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path}: not a regular file")
        return fd, real
    except BaseException:
        os.close(fd)
        raise


def _header(data: bytearray, path: str) -> tuple[dict[str, Any], int]:
    """(the JSON header of a safetensors file's bytes, where its data starts)."""
    if len(data) < 8:
        raise ValueError(f"{path}: not a readable safetensors file (shorter than its header)")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > min(MAX_HEADER_BYTES, len(data) - 8):
        raise ValueError(f"{path}: not a readable safetensors file (header of {n} bytes)")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except (ValueError, RecursionError):
        raise ValueError(f"{path}: not a readable safetensors file (header not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a readable safetensors file (header not an object)")
    return header, 8 + n


def _dtypes() -> dict[str, Any]:
    import torch

    names = {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
        "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
        "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "U16": "uint16", "U32": "uint32", "U64": "uint64",
    }  # fmt: skip
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


def _tensors(data: bytearray, path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(name -> tensor, metadata) of a safetensors file's bytes; the tensors are views of
    ``data`` (no copy), each checked to lie inside it with the size its shape and dtype say."""
    import torch

    header, start = _header(data, path)
    dtypes = _dtypes()
    tensors: dict[str, Any] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = dtypes[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name[:80]!r} has a malformed header entry") from None
        numel = 1
        for d in shape:
            numel *= d
        size = numel * torch.empty((), dtype=dtype, device="cpu").element_size()
        if (
            min(shape, default=0) < 0
            or not 0 <= begin <= end <= len(data) - start
            or (end - begin != size)
        ):
            raise ValueError(f"{path}: tensor {name[:80]!r} does not fit the file's bytes")
        if numel == 0:
            tensors[name] = torch.empty(shape, dtype=dtype, device="cpu")  # read from a file
        else:
            flat = torch.frombuffer(data, dtype=dtype, count=numel, offset=start + begin)
            tensors[name] = flat.reshape(shape)
    meta = header.get("__metadata__")
    metadata = {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}
    return tensors, metadata


def read_safetensors(path: str, root: str | None = None) -> WeightFile:
    """The tensors of the safetensors file ``path``, read from one checked descriptor (see the
    module doc). Raises PermissionError (outside ``root``), FileNotFoundError, and ValueError
    (:class:`WeightFileChanged` among them) naming ``path`` for a file that cannot be used."""
    fd, real = _open_checked(path, root)
    try:
        before = os.fstat(fd)
        data = _read_all(fd, before.st_size, path)
        if _identity(os.fstat(fd)) != _identity(before):
            raise WeightFileChanged(f"{path}: the file changed while it was read")
    finally:
        os.close(fd)
    tensors, metadata = _tensors(data, path)
    return WeightFile(tensors, metadata, real)


def _read_header(path: str) -> dict[str, Any]:
    """The JSON header of the safetensors file ``path``, the tensors' data left unread."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        head = os.read(fd, 8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a readable safetensors file (shorter than its header)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise ValueError(f"{path}: not a readable safetensors file (header of {n} bytes)")
        raw = b""
        while len(raw) < n:
            chunk = os.read(fd, n - len(raw))
            if not chunk:
                raise ValueError(f"{path}: not a readable safetensors file (header cut short)")
            raw += chunk
    finally:
        os.close(fd)
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError(f"{path}: not a readable safetensors file (header not JSON)") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a readable safetensors file (header not an object)")
    return header


def header_metadata(path: str) -> dict[str, str]:
    """The ``__metadata__`` of the safetensors file ``path`` (its header only)."""
    meta = _read_header(path).get("__metadata__")
    return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}


def header_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the header of the safetensors file ``path`` (its header only);
    ValueError for a file that is not one."""
    return {
        str(name): tuple(int(d) for d in entry["shape"])
        for name, entry in _read_header(path).items()
        if name != "__metadata__" and isinstance(entry, dict) and "shape" in entry
    }
