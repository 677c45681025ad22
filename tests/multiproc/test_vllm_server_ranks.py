"""vLLM servers shared by several trainer processes (no vLLM needed: HTTP calls recorded).

Rank 0 alone drives the servers (start, weights written and reloaded, versions, pauses); every
rank consumes the weight iterator (a sharded model's gather is a collective), gets the servers'
addresses from rank 0, holds the same version, and raises rank 0's one-line server error.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from procs import SUPPORT, TIMEOUT_S, subprocess_env

from areal_m2po.engine.server_launcher import free_port

pytestmark = pytest.mark.multiproc


def test_rank_0_drives_the_servers_and_every_rank_follows(tmp_path):
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(SUPPORT / "vllm_rank_worker.py"),
                str(r),
                "2",
                str(port),
                str(tmp_path),
            ],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    for p in procs:
        out, _ = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, out[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    # rank 1 started nothing and learnt the addresses from rank 0
    assert r0["addrs"] == r1["addrs"] == ["127.0.0.1:7001", "127.0.0.1:7002"]
    # both consumed every tensor; only rank 0 wrote them and called the servers
    assert r0["consumed"] == r1["consumed"] == [0, 1, 2, 0, 1, 2]
    assert r0["weights_written"] and r0["version"] == r1["version"] == 1
    assert [c[0] for c in r0["calls"]] == ["setup", "_reload", "_label"]
    assert r0["calls"][1][1].endswith("rollout_weights/v1") and r0["calls"][1][2] == "1"
    assert r1["calls"] == []
    assert r0["version_after_set"] == r1["version_after_set"] == 4
    # a server fault on rank 0 is the same one line on every rank; the version stays
    want = "rollout server 127.0.0.1:7001: /collective_rpc returned 500"
    assert r0["error"] == r1["error"] == want
    assert r0["version_after_error"] == r1["version_after_error"] == 4
