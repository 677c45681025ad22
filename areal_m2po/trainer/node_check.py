"""What every process of a multi-process (multi-node) run must agree on, checked at start-up.

Nodes started by hand or by a scheduler can differ in ways that otherwise show up as a hang in
the first collective or as silently wrong training: another command line, another copy of the
data or the model at the same path, other package versions, an ``output_dir`` that is not on a
shared filesystem. Before any model loads, :func:`check_processes_agree` gathers from every
process (one ``all_gather_object``) a fingerprint of:

* every key of the resolved config (its value);
* the contents of every local file or folder a ``path`` key names (a sampled digest: names,
  sizes, and the first and last MiB of each file), so the data order and the starting weights
  agree;
* the versions of the packages that decide the data order and the maths;
* the recover checkpoint the process would resume from (``<output_dir>/recover``);

and compares them with rank 0's. A second small collective checks that every process sees a
marker file rank 0 wrote into ``output_dir`` (checkpoints are written by rank 0 and read by
every rank, so several nodes need a shared filesystem). A disagreement stops every process
with the same one line naming the first key and the node that differs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

from areal_m2po.api.errors import ConfigError
from areal_m2po.utils import dist, recover

PACKAGES = ("areal_m2po", "torch", "transformers", "accelerate", "datasets", "numpy")
"""Packages whose versions must agree across processes."""
SAMPLE_BYTES = 1 << 20
"""Bytes read from each end of a file for its digest."""
MARKER_PREFIX = ".node-check-"
SHARED_FS_KEY = "output_dir"
MARKER_WAIT_S = 10.0
"""How long a process looks for rank 0's marker before it counts as unseen (lagging NFS)."""


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a process runs: its node (``GROUP_RANK`` from torchrun; else the rank divided by
    the processes per node), its global rank and its host name."""

    node: int
    rank: int
    host: str

    def __str__(self) -> str:
        return f"node {self.node} (rank {self.rank}, host {self.host})"


def this_place() -> Place:
    rank = dist.rank()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    node = os.environ.get("GROUP_RANK")
    if node is None:
        node = str(rank // per_node) if per_node > 0 else "0"
    return Place(int(node), rank, socket.gethostname())


def check_processes_agree(config: Any, output_dir: str) -> None:
    """Raise :class:`ConfigError` on every process, with the same one line, when the processes
    of this run disagree on a key of :func:`fingerprint` or do not share ``output_dir``; a
    no-op in one process. Collective: every process must call it."""
    if not dist.is_distributed():
        return
    place = this_place()
    token = uuid.uuid4().hex if dist.rank() == 0 else ""
    marker = os.path.join(output_dir, MARKER_PREFIX + token)
    if token:
        os.makedirs(output_dir, exist_ok=True)
        open(marker, "w").close()
    try:
        gathered = dist.all_gather_object((place, token, fingerprint(config, output_dir)))
        _raise_on_difference([(p, f) for p, _, f in gathered])
        marker = os.path.join(output_dir, MARKER_PREFIX + gathered[0][1])
        sees = dist.all_gather_object((place, _wait_for(marker)))
        blind = [p for p, seen in sees if not seen]
        if blind:
            raise ConfigError(
                SHARED_FS_KEY,
                f"{blind[0]} does not see the files {gathered[0][0]} writes into "
                f"{output_dir} (a marker file written there at start-up); every node needs "
                "output_dir on a filesystem all nodes share",
            )
    except ConfigError:
        dist.end_process_group()  # every process raises the same error: leave in order
        raise
    finally:
        if token:
            _remove(marker)


def fingerprint(config: Any, output_dir: str) -> dict[str, str]:
    """``{key: value}`` of what must agree across processes (see the module docstring)."""
    items: dict[str, str] = {}
    for key, value in _config_items(config):
        items[key] = repr(value)
        if _names_local_path(key, value):
            items[f"{key} (contents)"] = path_digest(value)
    for package in PACKAGES:
        items[f"{package} version"] = _version(package)
    latest = recover.latest_checkpoint(recover.recover_root(output_dir))
    items["recover checkpoint to resume"] = os.path.basename(latest) if latest else "none"
    return items


def _raise_on_difference(gathered: list[tuple[Place, dict[str, str]]]) -> None:
    """ConfigError naming the first key (in rank 0's order) on which a process differs."""
    first_place, first = gathered[0]
    for key, value in first.items():
        for place, items in gathered[1:]:
            theirs = items.get(key, "<missing>")
            if theirs != value:
                raise ConfigError(
                    key,
                    f"differs between nodes: {place} has {_short(theirs)}, {first_place} has "
                    f"{_short(value)}; start every node with the same command, files and "
                    "packages",
                )
    for place, items in gathered[1:]:
        extra = sorted(set(items) - set(first))
        if extra:
            raise ConfigError(extra[0], f"differs between nodes: {place} has it, {first_place} not")


def _config_items(section: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a config dataclass tree."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from _config_items(value, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, value


def _names_local_path(key: str, value: Any) -> bool:
    """Whether ``key`` is a ``path`` key (``path``, ``*_path``) naming an existing local file or
    folder (``output_dir`` is the run's own and changes as it runs)."""
    name = key.rsplit(".", 1)[-1]
    return (
        isinstance(value, str)
        and (name == "path" or name.endswith("_path"))
        and value != ""
        and os.path.exists(value)
    )


def path_digest(path: str) -> str:
    """A digest of a file or a folder (every file under it, by relative name): names, sizes and
    the first and last :data:`SAMPLE_BYTES` of each file (equal copies agree; reading whole
    model files at every start-up would be slow)."""
    h = hashlib.sha256()
    files = [("", path)] if os.path.isfile(path) else sorted(_walk(path))
    for rel, full in files:
        size = os.path.getsize(full)
        h.update(f"{rel}\0{size}\0".encode())
        with open(full, "rb") as fh:
            h.update(fh.read(SAMPLE_BYTES))
            if size > 2 * SAMPLE_BYTES:
                fh.seek(size - SAMPLE_BYTES)
                h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()[:16]


def _walk(folder: str) -> Iterator[tuple[str, str]]:
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            full = os.path.join(root, name)
            yield os.path.relpath(full, folder), full


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _wait_for(path: str) -> bool:
    deadline = time.monotonic() + MARKER_WAIT_S
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def _short(value: str, limit: int = 120) -> str:
    return value if len(value) <= limit else value[: limit - 3] + "..."
