"""What a rollout server can do wrong, as the remote engine tells it apart.

Every message is one line starting ``rollout server <host:port>: ``, which the trainer prints
with the last good recover checkpoint.

* :class:`ServerError`: the server failed (no connection, a timeout, a 5xx answer, a reply that
  is not what the protocol says, no answer to ``/health``, its process exited). The engine marks
  the server dead; with ``rollout.tolerate_server_failures`` its requests continue on the
  others.
* :class:`RequestError`: the server answered 4xx, so it is alive and this request is what is
  wrong (a prompt it cannot take, a setting it refuses). Nothing is marked dead and the request
  is not sent to another server: the caller gets the error.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RequestError", "RolloutServerError", "ServerError"]


class RolloutServerError(RuntimeError):
    """A rollout server failed or refused a request (one line naming it).

    Args:
        addr: the server's ``host:port``.
        message: what happened.
    """

    def __init__(self, addr: str, message: str) -> None:
        self.addr = addr
        self.reason = message
        super().__init__(f"rollout server {addr}: {message}")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (sent to other ranks) with its fields
        return (type(self), (self.addr, self.reason))


class ServerError(RolloutServerError):
    """The server failed: connection, timeout, 5xx, malformed reply, ``/health``, exit."""


class RequestError(RolloutServerError):
    """The server answered ``status`` (4xx): this request is bad, the server is fine."""

    def __init__(self, addr: str, message: str, status: int) -> None:
        self.status = status
        super().__init__(addr, message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.addr, self.reason, self.status))
