"""Bounded connections for the servers started here (the HF rollout server, the agent endpoint).

uvicorn neither caps connections nor times out a connection that has not sent a whole request:
its ``limit_concurrency`` answers 503 only once a request arrives, and its keep-alive timeout
starts only after a response. So a local user holding ~1,100 idle TCP connections exhausted a
1,024-descriptor process, and ``/health`` (the trainer's probe, 10 s) stopped answering.

:func:`bounded_http_protocol` returns uvicorn's h11 protocol with two rules:

* **A request within ``request_timeout_s``.** A connection whose current request (from its
  connect, or from the end of its last response) is not fully received within the timeout is
  closed: idle connections, slow headers and slow bodies alike. A request fully received and
  being answered (a long generation) is never cut.
* **At most ``max_connections``.** A connection beyond the cap closes the oldest connection
  that is not being answered (idle or still sending); when every connection is being
  answered, the new one is closed. A new probe therefore always gets through a flood of idle
  connections, and descriptors stay bounded.

The cap alone does not bound descriptors: asyncio accepts up to its listen backlog of queued
connections in one pass of the loop (uvicorn's default backlog is 2,048), before any of them
reaches the protocol, and an evicted connection's socket closes a pass or two later. Inside a
training run limited to 1,024 descriptors, a flood of 1,100 queued connections was accepted at
once and the agent's own client got ``Too many open files``. So :func:`uvicorn_limits` also
sets the backlog to :data:`BACKLOG` (a pass accepts at most that many) and sizes the cap to a
quarter of the process's descriptor limit: the cap plus a few passes' accepts stay well under
it, leaving the rest to the process's own files.

Pass :func:`uvicorn_limits` to ``uvicorn.Config`` / ``uvicorn.run`` (or the class alone as
``http=...``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = [
    "BACKLOG",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "bounded_http_protocol",
    "max_connections_for",
    "uvicorn_limits",
]

DEFAULT_MAX_CONNECTIONS = 512
"""Open connections a server keeps (the trainer's HTTP client uses at most 100 per server)."""
DEFAULT_REQUEST_TIMEOUT_S = 5.0
"""Seconds a connection has to send a whole request (well under the trainer's 10 s probe)."""
BACKLOG = 64
"""The listen backlog: connections the kernel queues, and the most one loop pass accepts."""


def max_connections_for(fd_limit: int | None) -> int:
    """The connection cap of a process allowed ``fd_limit`` descriptors (None: no limit): a
    quarter of the limit, between 16 and :data:`DEFAULT_MAX_CONNECTIONS`. The cap plus the
    connections accepted but not yet closed (a few :data:`BACKLOG` passes) stay under half the
    limit; the process's own files, pipes and outgoing connections have the rest."""
    if fd_limit is None or fd_limit <= 0:
        return DEFAULT_MAX_CONNECTIONS
    return max(16, min(DEFAULT_MAX_CONNECTIONS, fd_limit // 4))


def _open_file_limit() -> int | None:
    """This process's soft descriptor limit now (None: unlimited or not POSIX)."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else int(soft)


def uvicorn_limits() -> dict[str, Any]:
    """``uvicorn.Config`` keywords of a bounded server: the protocol of the module doc, capped
    for this process's descriptor limit now (raise the limit first), :data:`BACKLOG`, and a
    keep-alive of :data:`DEFAULT_REQUEST_TIMEOUT_S`."""
    return {
        "http": bounded_http_protocol(max_connections_for(_open_file_limit())),
        "backlog": BACKLOG,
        "timeout_keep_alive": int(DEFAULT_REQUEST_TIMEOUT_S),
    }


def bounded_http_protocol(
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with the rules of the module doc (a new class per call, so each
    server holds its own limits)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class BoundedH11Protocol(H11Protocol):
        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._request_since = time.monotonic()
            self._arm()
            if len(self.connections) > max_connections:
                self._evict()

        def _receiving(self) -> bool:
            """Whether this connection owes us (part of) a request: not being answered."""
            return bool(self.conn.their_state is not h11.DONE)

        def _evict(self) -> None:
            idle = [
                c
                for c in self.connections
                if isinstance(c, BoundedH11Protocol)
                and c is not self
                and not c.transport.is_closing()
                and c._receiving()
            ]
            victim = min(idle, key=lambda c: c._request_since) if idle else self
            victim.transport.close()

        def _arm(self) -> None:
            self.loop.call_later(request_timeout_s, self._check_deadline, self._request_since)

        def _check_deadline(self, since: float) -> None:
            if self.transport.is_closing() or since != self._request_since:
                return  # closed, or a later request's own timer is running
            if self._receiving():
                self.transport.close()

        def on_response_complete(self) -> None:
            self._request_since = time.monotonic()
            self._arm()
            super().on_response_complete()

    return BoundedH11Protocol
