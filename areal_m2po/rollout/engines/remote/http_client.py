"""The one HTTP client of the remote engine: calls to rollout servers, ``/health`` probes and
the wait for every server at start, over one ``httpx.AsyncClient`` (one event loop).

Every request carries the servers' API key (``Authorization: Bearer``) when there is one.
Answers are sorted into the errors of :mod:`.errors`: a 4xx is a :class:`RequestError`, but
a 401 (the server wants another key) is a :class:`ServerError`, since no request can be served
there; no connection, a timeout, any other status or a body that is not JSON is a
:class:`ServerError` (naming the process's exit when it was started here and has exited).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from areal_m2po.rollout.common.connections import DEFAULT_REQUEST_TIMEOUT_S
from areal_m2po.rollout.engines.remote.errors import RequestError, ServerError

__all__ = ["KEEPALIVE_EXPIRY_S", "HttpCall", "ServerClient"]

KEEPALIVE_EXPIRY_S = DEFAULT_REQUEST_TIMEOUT_S / 2
"""Seconds an idle connection is reused. Our servers close a connection idle for
``DEFAULT_REQUEST_TIMEOUT_S`` (5 s); httpx's default expiry is the same 5 s, so a call sent on a
connection just as the server closed it failed with "Server disconnected without sending a
response", and the engine counted a live server dead. Half the server's timeout leaves room."""

ExitReason = Callable[[str], "str | None"]
"""``exit_reason(addr)``: why the server at ``addr`` is gone (its process exited), or None."""


@dataclass(frozen=True)
class HttpCall:
    """One request to a server: ``POST endpoint`` with a JSON ``payload`` (None: no body)."""

    endpoint: str
    payload: Any = None


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:300] if lines else ""


class ServerClient:
    """Calls to rollout servers.

    Args:
        request_timeout: seconds one call may take.
        health_timeout: seconds one ``/health`` probe may take.
        exit_reason: tells a server whose process exited (servers started here), or None.
        api_key: the servers' key, sent with every request (None: none).
    """

    def __init__(
        self,
        request_timeout: float,
        health_timeout: float,
        exit_reason: ExitReason | None = None,
        api_key: str | None = None,
    ) -> None:
        self.request_timeout = request_timeout
        self.health_timeout = health_timeout
        self.exit_reason = exit_reason or (lambda addr: None)
        limits = httpx.Limits(
            max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY_S
        )  # httpx's defaults but the expiry
        self._http = httpx.AsyncClient(timeout=request_timeout, limits=limits)
        self.set_api_key(api_key)

    def set_api_key(self, api_key: str | None) -> None:
        """Send ``api_key`` with every later request (None: no key)."""
        self._http.headers.pop("Authorization", None)
        if api_key:
            self._http.headers["Authorization"] = f"Bearer {api_key}"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(self, addr: str, call: HttpCall) -> Any:
        """The JSON reply of ``call`` on ``addr`` (None for an empty body)."""
        endpoint = call.endpoint.split("?")[0]
        try:
            resp = await self._http.post(f"http://{addr}{call.endpoint}", json=call.payload)
        except httpx.TimeoutException:
            raise ServerError(
                addr, f"{endpoint} timed out after {self.request_timeout:g}s"
            ) from None
        except httpx.HTTPError as exc:
            reason = self.exit_reason(addr)
            raise ServerError(
                addr, reason or f"{endpoint} failed: {type(exc).__name__}: {exc}"
            ) from None
        if resp.status_code == 401:
            raise ServerError(
                addr, f"{endpoint} refused our API key (401): start the server with the run's key, "
                "or give its key in rollout.server_api_key or AREAL_M2PO_SERVER_API_KEY",
            )  # fmt: skip
        if 400 <= resp.status_code < 500:
            raise RequestError(
                addr, f"{endpoint} refused the request ({resp.status_code}): "
                f"{_first_line(resp.text)}", resp.status_code,
            )  # fmt: skip
        if resp.status_code != 200:
            raise ServerError(
                addr, f"{endpoint} returned {resp.status_code}: {_first_line(resp.text)}"
            )
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise ServerError(addr, f"{endpoint} replied with no JSON: {resp.text[:300]}") from None

    async def healthy(self, addr: str) -> bool:
        """Whether ``addr`` answers ``GET /health`` with 200 within ``health_timeout``."""
        try:
            resp = await self._http.get(f"http://{addr}/health", timeout=self.health_timeout)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    async def wait_healthy(self, addrs: Sequence[str], timeout: float) -> None:
        """Return once every server answers ``/health``; ServerError naming the first that
        exited or did not answer within ``timeout`` seconds (``rollout.setup_timeout``)."""
        deadline = time.monotonic() + timeout
        for addr in addrs:
            while not await self.healthy(addr):
                reason = self.exit_reason(addr)
                if reason:
                    raise ServerError(addr, reason)
                if time.monotonic() > deadline:
                    raise ServerError(
                        addr, f"did not answer /health within {timeout:g}s (rollout.setup_timeout)"
                    )
                await asyncio.sleep(0.5)
