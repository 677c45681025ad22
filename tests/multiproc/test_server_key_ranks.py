"""Every trainer process sends the key of the rollout servers trainer rank 0 starts: rank 0
makes the run's key and the others receive it (two gloo processes over loopback)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from procs import TIMEOUT_S, subprocess_env

from areal_m2po.utils.net import free_port

pytestmark = pytest.mark.multiproc

WORKER = """
import sys, torch.distributed as dist
from areal_m2po.api.config_loader import load_config
from areal_m2po.rollout.factory import RolloutParts, run_server_key
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
def parts():
    return RolloutParts(tokenizer=None, loader=None, reward=None, output_dir=".", rank=rank,
                        world=2, device=None, policy_model=None, model_config=None,
                        generation_config=None)
started = run_server_key(load_config([]), parts())
elsewhere = run_server_key(load_config(["rollout.server_addrs=[127.0.0.1:1]"]), parts())
print(f"KEY {started} {elsewhere}", flush=True)
dist.destroy_process_group()
"""


def test_every_rank_gets_the_key_of_the_servers_rank_0_starts(monkeypatch):
    monkeypatch.delenv("AREAL_M2PO_SERVER_API_KEY", raising=False)
    port = str(free_port())
    env = subprocess_env()
    env.pop("AREAL_M2PO_SERVER_API_KEY", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    outs = [p.communicate(timeout=TIMEOUT_S)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    keys = [
        next(line.split()[1:] for line in out.splitlines() if line.startswith("KEY"))
        for out in outs
    ]
    (key0, none0), (key1, none1) = keys
    assert key0 == key1 and len(key0) >= 32  # one key, made by rank 0, on both ranks
    assert none0 == none1 == "None"  # servers elsewhere without a key: none is sent
