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
