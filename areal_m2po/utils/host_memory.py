"""Give the host memory a training step freed back to the operating system.

glibc keeps freed blocks in its heaps for reuse instead of returning them, and after a large
block is freed it raises its mmap threshold, so later blocks of up to 32 MiB come from the heap
too. A training step allocates and frees gigabytes of activations and logits, so between steps
a CPU run holds far more than it uses: measured on the main job's first three updates, the
resident set after the update was 3.07 / 4.27 / 5.18 GB without a trim and 2.41 GB each time
with ``malloc_trim(0)`` after the update (a few milliseconds). That memory is then free for
other processes between steps. It does not lower the peak inside a step: the whole main job
peaked at 9.6 GB with the trim and 9.8 GB without.

Inside a step, :func:`set_mmap_threshold` bounds what the heaps keep: blocks at least that large
are mapped on their own and unmapped when freed, so the activations one micro-batch frees are
not resident beside the next one's (``host_mmap_threshold_mib``; docs/performance.md).
Sampling pays for that bound in page faults on every step's logits and activations, far from
the run's peak: :func:`lifted_mmap_threshold` lifts it while a sync rollout samples.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Iterator

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc malloc.h)
MAX_MMAP_THRESHOLD_MIB = 32
"""glibc's ceiling for the threshold on 64-bit systems (HEAP_MAX_SIZE / 2)."""


def _libc_function(name: str) -> object | None:
    """``name`` from the C library this process runs on; None off Linux or where it lacks it
    (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None


def set_mmap_threshold(mib: int) -> bool:
    """Serve host allocations of at least ``mib`` MiB with their own ``mmap``, returned to the
    operating system when freed (glibc ``mallopt(M_MMAP_THRESHOLD)``; it also stops glibc from
    raising the threshold by itself). Process-wide; costs page faults on each such allocation.

    Args:
        mib: the threshold in MiB, 1 to :data:`MAX_MMAP_THRESHOLD_MIB`.
    Returns:
        True when set; False where this C library has no ``mallopt`` (nothing changes).
    Raises:
        ValueError: ``mib`` is out of range.
    """
    if isinstance(mib, bool) or not (isinstance(mib, int) and 1 <= mib <= MAX_MMAP_THRESHOLD_MIB):
        raise ValueError(f"mmap threshold must be 1..{MAX_MMAP_THRESHOLD_MIB} MiB, got {mib!r}")
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mib * 1024 * 1024))  # type: ignore[operator]


def release_free_host_memory() -> bool:
    """Return the free pages of the C heap to the operating system (glibc's ``malloc_trim``).

    Returns:
        True when memory was released; False when none was, or on a platform without
        ``malloc_trim`` (macOS, Windows, musl), where this does nothing.
    """
    trim = _libc_function("malloc_trim")
    return False if trim is None else bool(trim(0))  # type: ignore[operator]


@contextlib.contextmanager
def lifted_mmap_threshold(restore_mib: int | None) -> Iterator[None]:
    """Blocks under :data:`MAX_MMAP_THRESHOLD_MIB` come from the heaps inside the block (reused,
    no page faults); after it the threshold is ``restore_mib`` again and the heaps' free pages
    go back to the operating system. ``restore_mib`` None: nothing is changed (the process
    runs under glibc's own threshold). Process-wide: only for code that allocates alone (a
    sync rollout, while the trainer waits)."""
    if restore_mib is None:
        yield
        return
    set_mmap_threshold(MAX_MMAP_THRESHOLD_MIB)
    try:
        yield
    finally:
        set_mmap_threshold(restore_mib)
        release_free_host_memory()
