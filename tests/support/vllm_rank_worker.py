"""One of several gloo processes sharing vLLM servers (tests/multiproc/test_vllm_server_ranks.py).

``python vllm_rank_worker.py RANK WORLD PORT OUT_DIR``: builds a
:class:`~areal_m2po.rollout.engines.remote.vllm.RemoteVLLMEngine` as the trainer does on every
rank; rank 0 hands it the servers it "started" (two scripted servers over real loopback HTTP,
no vLLM), drives it like the trainer, and writes what it saw (and, on rank 0, the calls each
server received) to ``OUT_DIR/rank<RANK>.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import torch
import torch.distributed as dist
from scripted_server import ScriptedServer

from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.errors import RolloutServerError
from areal_m2po.rollout.engines.remote.vllm import RemoteVLLMEngine
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


class _StartedServers:
    """The servers rank 0 started, as the engine sees them."""

    def __init__(self) -> None:
        self.servers = [ScriptedServer().start(), ScriptedServer().start()]
        self.addrs = [s.addr for s in self.servers]
        self.stopped = False

    def exit_reason(self, addr: str) -> None:
        return None

    def stop(self) -> None:
        self.stopped = True


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model_dir = os.path.join(out_dir, "model")
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as fh:
        json.dump({"model_type": "llama", "tie_word_embeddings": False}, fh)
    options = RemoteEngineOptions(
        weights_root=os.path.join(out_dir, "rollout_weights"), health_check_interval=60.0
    )
    started = _StartedServers() if rank == 0 else None
    engine = RemoteVLLMEngine(
        build_tiny_tokenizer(), model_dir, options, processes=started, rank=rank, world=world
    )
    engine.initialize()
    seen: dict = {"addrs": engine.addrs}
    request = ModelRequest([10 + rank], SamplingParams(max_new_tokens=2))
    seen["generated"] = asyncio.run(engine.agenerate(request)).output_ids

    consumed = []

    def weights():  # every rank must consume it (a sharded model's gather)
        for i in range(3):
            dist.barrier()  # a collective per tensor, as FSDP2's gather is
            consumed.append(i)
            yield f"w{i}", torch.full((2,), float(i))

    engine.update_weights_from_tensors(weights(), version=1)
    seen["consumed"] = consumed
    seen["version"] = engine.get_version()
    seen["weights_written"] = os.path.isdir(os.path.join(out_dir, "rollout_weights", "v1"))
    engine.set_version(4)
    seen["version_after_set"] = engine.get_version()
    dist.barrier()
    if started is not None:
        started.servers[0].fail_with["/collective_rpc"] = 500
    try:
        engine.update_weights_from_tensors(weights(), version=5)
        seen["error"] = None
    except RolloutServerError as exc:
        seen["error"] = str(exc)
    seen["version_after_error"] = engine.get_version()
    engine.destroy()
    if started is not None:
        seen["stopped"] = started.stopped
        seen["server_addrs"] = started.addrs
        seen["calls"] = [
            [[endpoint, body] for endpoint, body in s.calls if endpoint != "/health"]
            for s in started.servers
        ]
        for s in started.servers:
            s.stop()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(seen, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
