"""The connection cap follows the process's descriptor limit (rollout/common/connections.py)."""

from __future__ import annotations

import asyncio

from areal_m2po.rollout.common.connections import (
    BACKLOG,
    DEFAULT_MAX_CONNECTIONS,
    max_connections_for,
    uvicorn_limits,
)


def test_the_cap_is_a_quarter_of_the_limit_within_bounds():
    assert max_connections_for(1024) == 256  # the usual limit: 256 + a few 64-backlog passes
    assert max_connections_for(4096) == DEFAULT_MAX_CONNECTIONS == 512
    assert max_connections_for(1_048_576) == 512
    assert max_connections_for(40) == 16  # never below 16
    assert max_connections_for(None) == 512  # unlimited


def test_the_cap_plus_a_few_accept_passes_stays_under_half_the_limit():
    for limit in (1024, 2048, 4096, 65536):
        assert max_connections_for(limit) + 2 * BACKLOG <= limit // 2


def test_uvicorn_limits():
    kwargs = uvicorn_limits()
    assert kwargs["backlog"] == BACKLOG == 64
    assert kwargs["timeout_keep_alive"] == 5
    assert issubclass(kwargs["http"], asyncio.Protocol)


def test_the_remote_engine_drops_an_idle_connection_before_the_server_does():
    """A loopback server that counts connections: a call, a pause of 3 s (between the client's
    expiry and the servers' 5 s idle timeout), a call. Old code reused the connection until 5 s
    (httpx's default), racing the server's close at 5 s; now the second call opens a new one."""
    from areal_m2po.rollout.common.connections import DEFAULT_REQUEST_TIMEOUT_S
    from areal_m2po.rollout.engines.remote.http_client import HttpCall, ServerClient

    connections = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the client closed it
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")), 0,
            )  # fmt: skip
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async def go() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = ServerClient(request_timeout=10, health_timeout=5)
        try:
            assert await client.call(f"127.0.0.1:{port}", HttpCall("/x", {})) == {}
            await asyncio.sleep(3.0)
            assert await client.call(f"127.0.0.1:{port}", HttpCall("/x", {})) == {}
        finally:
            await client.aclose()
            for writer in connections:
                writer.close()
            server.close()

    assert DEFAULT_REQUEST_TIMEOUT_S > 3.0
    asyncio.run(go())
    assert len(connections) == 2
