"""release_free_host_memory gives freed heap pages back to the operating system."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from areal_m2po.utils.host_memory import release_free_host_memory


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
