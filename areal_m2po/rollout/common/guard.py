"""The gate in front of every rollout server started here: only the trainer can drive it.

:class:`ServerGuard` is a plain ASGI middleware (it imports only the standard library, so the
vLLM servers load it from their own environment):

* **Key.** With an API key, every request except ``GET /health`` must carry
  ``Authorization: Bearer <key>``, else 401 (a websocket is closed before it is accepted:
  403). ``/health`` stays open: it answers 200 and nothing else, changes nothing, and is what
  load balancers, Slurm and ``curl`` probes call without secrets (vLLM and SGLang leave it
  open too).
* **Body size.** A request body must state its length (``Content-Length``; a chunked body gets
  411) and hold at most ``max_body_bytes`` (else 413, naming the limit), checked before the body
  is read.

The trainer generates a key per run (``secrets.token_urlsafe``) and hands it to the servers it
starts through their environment (:data:`API_KEY_ENV`), never on their command line, which
``ps`` shows to every user and vLLM writes to its log. The HF server takes it as ``--api-key``
too; vLLM servers get :class:`VLLMServerGuard` through vLLM's ``--middleware`` flag besides
vLLM's own ``--api-key`` (``VLLM_API_KEY``), which guards only ``/v1``, ``/v2``,
``/inference`` and ``/cohere`` and leaves the weight and pause endpoints open.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_BODY_ENV",
    "OPEN_PATHS",
    "ServerGuard",
    "VLLMServerGuard",
    "WEIGHTS_ROOT_ENV",
    "bearer_matches",
    "below_root",
]

API_KEY_ENV = "AREAL_M2PO_SERVER_API_KEY"
"""The environment variable holding the key: of the servers (their key) and of the trainer
(the key of servers started elsewhere, when ``rollout.server_api_key`` is not set)."""

MAX_BODY_ENV = "AREAL_M2PO_SERVER_MAX_BODY_BYTES"
"""The environment variable a vLLM server reads its body-size limit from."""

WEIGHTS_ROOT_ENV = "AREAL_M2PO_WEIGHTS_ROOT"
"""The environment variable naming the folder a vLLM server's weight reload may read below
(set by ``vllm_server_main --weights-root``, read by the worker extension)."""

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
"""16 MiB: a 1M-token context as JSON (about 8 bytes a token) with room to spare, and small
enough that parsing a body this size holds the server's event loop well under a second, far
below the trainer's 10 s ``/health`` probe timeout (64 MiB held it for 10-16 s)."""

OPEN_PATHS = ("/health",)
"""Paths served without the key."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def bearer_matches(header: str | None, key: str) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <key>`` (compared in constant
    time)."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = hashlib.sha256(token.strip().encode()).digest()
    return hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest())


def below_root(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it, symlinks resolved in both."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([real, base]) == base


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ServerGuard:
    """Key and body-size checks in front of ``app`` (see the module doc).

    Args:
        app: the server's ASGI application.
        api_key: the key every request but ``/health`` must carry (None: no key needed).
        max_body_bytes: the largest request body accepted.
        server: names the server in messages (``rollout server``).
        limit_name: what sets ``max_body_bytes``, named in a 413.
    """

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        server: str = "rollout server",
        limit_name: str = "--max-body-bytes",
    ) -> None:
        self.app = app
        self.api_key = api_key or None
        self.max_body_bytes = int(max_body_bytes)
        self.server = server
        self.limit_name = limit_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        keyed = self.api_key is None or bearer_matches(headers.get("authorization"), self.api_key)
        if scope["type"] == "websocket":
            if keyed:
                await self.app(scope, receive, send)
            else:  # closed before it is accepted: the server answers 403
                await receive()
                await send({"type": "websocket.close", "code": 1008})
            return
        if not keyed:
            await _refuse(
                send, 401, f"{self.server}: a missing or wrong API key (Authorization: Bearer)"
            )
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            await _refuse(send, 411, f"{self.server}: send the body with a Content-Length")
            return
        length = headers.get("content-length", "0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            await _refuse(
                send,
                413,
                f"request body of {length[:30]} bytes exceeds the limit of "
                f"{self.max_body_bytes} bytes ({self.limit_name})",
            )
            return
        await self.app(scope, receive, send)


class VLLMServerGuard(ServerGuard):
    """:class:`ServerGuard` as vLLM's ``--middleware`` loads it (built with the app alone): the
    key from :data:`API_KEY_ENV`, the body limit from :data:`MAX_BODY_ENV`."""

    def __init__(self, app: ASGIApp) -> None:
        limit = os.environ.get(MAX_BODY_ENV) or DEFAULT_MAX_BODY_BYTES
        super().__init__(app, os.environ.get(API_KEY_ENV), int(limit), "vLLM server")
