"""release_free_host_memory gives freed heap pages back to the operating system;
set_mmap_threshold makes freed large blocks leave the resident set at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from areal_m2po.utils.host_memory import release_free_host_memory, set_mmap_threshold


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_small_blocks_leave_the_resident_set() -> None:
    release_free_host_memory()
    # 4096 tensors of 64 KiB (below glibc's mmap threshold: they live in the heap), written to
    # so their pages are resident; then free all but every 64th, which pins the heap top
    blocks = [torch.ones(16 * 1024) for _ in range(4096)]  # 256 MiB
    kept = blocks[::64]
    del blocks
    before = _rss_bytes()
    assert release_free_host_memory() is True
    released = before - _rss_bytes()
    assert released > 128 * 2**20, f"only {released / 2**20:.0f} MiB returned"
    assert all(float(t[0]) == 1.0 for t in kept)  # what is still in use is untouched


def test_returns_false_when_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert release_free_host_memory() is False


_FREED_LARGE_BLOCKS = """
import os, sys, torch
from areal_m2po.utils.host_memory import set_mmap_threshold

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

assert set_mmap_threshold(int(sys.argv[1]))
big, small = [], []
for _ in range(64):
    big.append(torch.ones(2 * 2**20 // 4))  # 2 MiB, written: resident
    small.append(torch.ones(16))  # stays alive after each: the heap cannot shrink past it
before = rss()
del big
print((before - rss()) / 2**20)
"""


def _freed_large_blocks_mib(threshold_mib: int) -> float:
    """Resident MiB that 64 freed 2 MiB tensors give back at once (no trim), in a fresh
    process whose mmap threshold was set first (a heap's free blocks are reused before any
    new mapping, so the order matters)."""
    out = subprocess.run(
        [sys.executable, "-c", _FREED_LARGE_BLOCKS, str(threshold_mib)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_blocks_above_the_mmap_threshold_leave_the_resident_set_when_freed() -> None:
    # at 32 MiB (the ceiling glibc's own adjustment reaches) the 2 MiB blocks live in the heap
    # and stay resident after free; at 1 MiB (the trainers' CPU default) each has its own
    # mapping and goes back at once
    in_heap = _freed_large_blocks_mib(32)
    mapped = _freed_large_blocks_mib(1)
    assert in_heap < 32, f"{in_heap:.0f} MiB returned from the heap"
    assert mapped > 100, f"only {mapped:.0f} MiB returned"


@pytest.mark.parametrize("bad", [0, 33, 1.5, "1", True, None])
def test_mmap_threshold_out_of_range_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="mmap threshold must be 1..32 MiB"):
        set_mmap_threshold(bad)  # type: ignore[arg-type]


def test_mmap_threshold_is_a_no_op_off_linux(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert set_mmap_threshold(1) is False


_LIFTED = """
import os, torch
from areal_m2po.utils.host_memory import lifted_mmap_threshold, set_mmap_threshold

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def freed_at_once():
    big, small = [], []
    for _ in range(64):
        big.append(torch.ones(2 * 2**20 // 4))  # 2 MiB, written: resident
        small.append(torch.ones(16))
    before = rss()
    del big
    return (before - rss()) / 2**20, small

assert set_mmap_threshold(1)
with lifted_mmap_threshold(1):
    inside, keep = freed_at_once()
    held = rss()
trimmed = (held - rss()) / 2**20
print(inside, trimmed)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_lifted_threshold_keeps_blocks_in_the_heap_then_restores() -> None:
    """Inside ``lifted_mmap_threshold(1)`` freed 2 MiB blocks stay in the heap (reused, no
    page faults); leaving it gives their pages back (the restored threshold: the test below)."""
    out = subprocess.run(
        [sys.executable, "-c", _LIFTED],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    inside, trimmed = (float(x) for x in out.stdout.split()[-2:])
    assert inside < 32, f"{inside:.0f} MiB returned inside the block"
    assert trimmed > 64, f"only {trimmed:.0f} MiB trimmed on leaving it"


def test_a_lifted_threshold_of_none_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from areal_m2po.utils import host_memory

    calls: list[object] = []
    monkeypatch.setattr(host_memory, "set_mmap_threshold", calls.append)
    monkeypatch.setattr(host_memory, "release_free_host_memory", lambda: calls.append("trim"))
    with host_memory.lifted_mmap_threshold(None):
        pass
    assert calls == []
    with host_memory.lifted_mmap_threshold(4):
        assert calls == [32]
    assert calls == [32, 4, "trim"]
