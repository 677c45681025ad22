"""vLLM servers shared by several trainer processes (no vLLM needed: scripted servers over
loopback HTTP record the calls).

Rank 0 alone drives the servers (start, weights written and reloaded, versions, pauses); every
rank consumes the weight iterator (a sharded model's gather is a collective), gets the servers'
addresses from rank 0, generates its own requests on them, holds the same version, and raises
rank 0's one-line server error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from procs import SUPPORT, TIMEOUT_S, subprocess_env

from areal_m2po.utils.net import free_port

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
    a, b = r0["server_addrs"]
    # rank 1 started nothing and learnt the addresses from rank 0
    assert r0["addrs"] == r1["addrs"] == [a, b]
    # each rank generated on the servers, rank r starting its round robin at server r
    assert r0["generated"] == [11, 12] and r1["generated"] == [12, 13]
    # both consumed every tensor; only rank 0 wrote them and called the servers
    assert r0["consumed"] == r1["consumed"] == [0, 1, 2, 0, 1, 2]
    assert r0["weights_written"] and r0["version"] == r1["version"] == 1
    assert r0["version_after_set"] == r1["version_after_set"] == 4
    v1 = os.path.join(str(tmp_path), "rollout_weights", "v1")
    v5 = os.path.join(str(tmp_path), "rollout_weights", "v5")
    for i, calls in enumerate(r0["calls"]):
        assert calls[1][1]["token_ids"] == [10 + i]  # rank i's request
        updates = [(e, body) for e, body in calls if e != "/inference/v1/generate"]
        want = [
            ("/update_weight_version", {"new_version": "0"}),  # labelled at start
            ("/pause", None),
            ("/collective_rpc", {"method": "areal_reload_weights", "kwargs": {"path": v1}}),
            ("/reset_prefix_cache", None),
            ("/update_weight_version", {"new_version": "1"}),
            ("/resume", None),
            ("/update_weight_version", {"new_version": "4"}),  # set_version
            ("/pause", None),
            ("/collective_rpc", {"method": "areal_reload_weights", "kwargs": {"path": v5}}),
        ]
        if i == 0:  # its reload failed: resumed all the same
            want += [("/resume", None)]
        else:
            want += [
                ("/reset_prefix_cache", None),
                ("/update_weight_version", {"new_version": "5"}),
                ("/resume", None),
            ]
        assert [(e, json.loads(body) if isinstance(body, str) else body) for e, body in updates] \
            == want, i  # fmt: skip
    # a server fault on rank 0 is the same one line on every rank; the version stays
    want_error = f'rollout server {a}: /collective_rpc returned 500: {{"error":"scripted"}}'
    assert r0["error"] == r1["error"] == want_error
    assert r0["version_after_error"] == r1["version_after_error"] == 4
    assert r0["stopped"]
