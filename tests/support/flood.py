"""A bounded, loopback-only flood of idle TCP connections, held while a test runs.

:class:`IdleFlood` opens ``n`` connections to ``127.0.0.1:port`` that send nothing and keeps
``n`` open from its side: a connection the server closes (an idle timeout, an eviction) is
replaced, at most ``refill_per_s`` a second, so the pressure lasts as long as the flood. It
never opens more than ``n`` at once nor more than ``max_opens`` in all, and it closes every
connection when it stops (``with`` block, or :meth:`stop`).
"""

from __future__ import annotations

import resource
import select
import socket
import threading
import time

import pytest

__all__ = ["IdleFlood", "raise_own_file_limit"]


def raise_own_file_limit(need: int) -> None:
    """Raise this process's soft descriptor limit to its hard one when ``need`` exceeds it;
    skip the test when the hard limit is below ``need``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need:
        pytest.skip(f"this process may open only {hard} files; the flood needs {need}")


class IdleFlood:
    """``n`` idle connections to ``127.0.0.1:port``, refilled in a daemon thread (module doc).

    Attributes:
        held: connections open from this side now.
        max_held: the most held at once so far.
        opens: connections opened in all.
    """

    def __init__(
        self, port: int, n: int = 1100, refill_per_s: int = 100, max_opens: int = 200_000
    ) -> None:
        self.port, self.n = port, n
        self.refill_per_s, self.max_opens = refill_per_s, max_opens
        self.held: list[socket.socket] = []
        self.max_held = 0
        self.opens = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-flood", daemon=True)

    def __enter__(self) -> IdleFlood:
        self.fill(deadline_s=60.0)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _open_one(self) -> bool:
        if self.opens >= self.max_opens or len(self.held) >= self.n:
            return False
        s = socket.socket()
        s.settimeout(2)
        self.opens += 1
        try:
            s.connect(("127.0.0.1", self.port))
        except OSError:
            s.close()
            return False
        s.setblocking(False)
        self.held.append(s)
        self.max_held = max(self.max_held, len(self.held))
        return True

    def fill(self, deadline_s: float) -> None:
        """Open connections until ``n`` are held or ``deadline_s`` seconds pass."""
        stop = time.monotonic() + deadline_s
        while len(self.held) < self.n and time.monotonic() < stop and not self._stop.is_set():
            self._open_one()

    def _drop_closed(self) -> None:
        """Close and forget the connections whose peer closed them (readable: EOF or reset;
        an idle connection is never sent anything else)."""
        poller = select.poll()
        by_fd = {s.fileno(): s for s in self.held}
        for fd in by_fd:
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        gone = {fd for fd, _ in poller.poll(0)}
        for fd in gone:
            by_fd[fd].close()
        self.held = [s for fd, s in by_fd.items() if fd not in gone]

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self._drop_closed()
            for _ in range(self.refill_per_s):
                if self._stop.is_set() or not self._open_one():
                    break

    def stop(self) -> None:
        """Stop refilling and close every connection (idempotent)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for s in self.held:
            s.close()
        self.held = []
