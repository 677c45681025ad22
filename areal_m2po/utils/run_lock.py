"""One run per output folder at a time: a lock file in ``output_dir`` held for the whole run.

A double-submitted or requeued job starts a second run into the same folder while the first one
still runs; before either has written anything, the check for a folder that "already holds a
run" lets both through, and both then write ``metrics.jsonl`` and ``checkpoints/final``. The
first run's rank 0 therefore takes an exclusive ``flock`` on ``<output_dir>/.run.lock`` before
any other start-up check of the folder and keeps it until the process ends; a second run's
rank 0 finds it taken and stops in one line naming the first run (host, pid, start time).

The kernel releases a ``flock`` when its process dies (even on ``kill -9``), so a lock file
left by a dead process is simply taken over; the file still names that process, which the new
holder reports once. (``flock`` works on local file systems and on NFS v4; a shared folder
whose file system ignores it gets no protection from this lock.)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from typing import Any

from areal_m2po.api.errors import RunError

__all__ = ["LOCK_NAME", "RunFolderBusy", "RunFolderUnwritable", "RunLock"]

logger = logging.getLogger("areal_m2po.trainer")

LOCK_NAME = ".run.lock"


class RunFolderBusy(RunError):
    """Another live run holds the output folder's lock."""

    exit_status = 2


class RunFolderUnwritable(RunError):
    """The output folder cannot be created or written (found before any model loads)."""

    exit_status = 2


class RunLock:
    """The lock of one output folder (see the module docstring).

    Args:
        output_dir: the run's output folder; created when missing (and removed again on
            :meth:`release` if the run left it empty).
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, LOCK_NAME)
        self._fd: int | None = None
        self._created_dir = False

    def acquire(self) -> None:
        """Take the lock, or raise :class:`RunFolderBusy` naming the run that holds it.

        Raises:
            RunFolderBusy: one line, ``output_dir: ... is in use by the run of pid N on HOST``.
            RunFolderUnwritable: one line naming the folder and the system's reason.
        """
        if self._fd is not None:
            return
        if os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir):
            raise RunFolderUnwritable(
                f"output_dir: {self.output_dir} is a file, not a folder; choose another output_dir"
            )
        self._created_dir = not os.path.isdir(self.output_dir)
        try:
            os.makedirs(self.output_dir, exist_ok=True)
            fd = self._lock_file()
        except OSError as exc:  # a parent that is a file, no permission, a full disk
            raise RunFolderUnwritable(
                f"output_dir: cannot write into {self.output_dir} "
                f"({exc.strerror or type(exc).__name__}); choose another output_dir"
            ) from None
        previous = _read_holder(fd)
        if previous and previous.get("pid") != os.getpid():
            logger.warning(
                "output_dir: took over the lock of %s, which is no longer running",
                _describe(previous),
            )
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def _lock_file(self) -> int:
        """A descriptor of the lock file with the lock taken. A holder that is releasing
        unlinks the file first, so a lock taken on a file no longer at :attr:`path` is let go
        and taken again on the file that is."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # never truncated unlocked
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder_record = _read_holder(fd)
                if holder_record and holder_record.get("pid") == os.getpid():
                    # an earlier run of this process that never released it (its trainer
                    # failed to build): this process already holds the flock
                    return fd
                holder = _describe(holder_record)
                os.close(fd)
                raise RunFolderBusy(
                    f"output_dir: {self.output_dir} is in use by {holder}; wait for that run "
                    "to end, or choose another output_dir"
                ) from None
            try:
                current = os.stat(self.path).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                return fd
            os.close(fd)

    def release(self) -> None:
        """Remove the lock file and let the lock go (a no-op when not held)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        os.close(self._fd)  # closing the descriptor releases the flock
        self._fd = None
        if self._created_dir:
            with contextlib.suppress(OSError):  # only if the run left nothing in it
                os.rmdir(self.output_dir)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_holder(fd: int) -> dict[str, Any] | None:
    """The ``{"host", "pid", "started"}`` record in the lock file, or None (empty, unreadable)."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "null")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _describe(holder: dict[str, Any] | None) -> str:
    """``the run of pid N on HOST (started YYYY-mm-dd HH:MM:SS)``, or ``another run``."""
    if not holder:
        return "another run"
    started = holder.get("started")
    when = (
        time.strftime(" (started %Y-%m-%d %H:%M:%S)", time.localtime(started))
        if isinstance(started, (int, float))
        else ""
    )
    return f"the run of pid {holder.get('pid')} on {holder.get('host')}{when}"
