"""One of several gloo processes sharing vLLM servers (tests/multiproc/test_vllm_server_ranks.py).

``python vllm_rank_worker.py RANK WORLD PORT OUT_DIR``: builds a
:class:`~areal_m2po.rollout.vllm_server_engine.VLLMServerEngine` whose HTTP calls are recorded
instead of sent (no server, no vLLM), drives it like the trainer does on every rank, and writes
what it saw to ``OUT_DIR/rank<RANK>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

from areal_m2po.rollout.remote_engine import RolloutServerError
from areal_m2po.rollout.vllm_server_engine import VLLMServerEngine, VLLMServerEngineOptions
from areal_m2po.rollout.vllm_servers import VLLMServerOptions
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


class _FakeProcesses:
    """Stands in for the servers rank 0 started."""

    addrs = ["127.0.0.1:7001", "127.0.0.1:7002"]

    def exited(self, addr: str) -> None:
        return None

    def stop(self) -> None:
        pass


def main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    options = VLLMServerEngineOptions(weights_root=os.path.join(out_dir, "rollout_weights"))
    servers = VLLMServerOptions(model_path=out_dir)
    engine = VLLMServerEngine(
        build_tiny_tokenizer(), out_dir, options, servers=servers, rank=rank, world=world
    )
    engine._tied = False
    calls: list[list] = []

    async def no_setup() -> None:
        calls.append(["setup"])

    engine._setup = no_setup  # type: ignore[method-assign]

    def record(fn, *args) -> None:
        calls.append([fn.__name__, *map(str, args)])

    engine._run = record  # type: ignore[method-assign]
    if rank == 0:
        engine.processes = _FakeProcesses()  # type: ignore[assignment]
        engine._addrs = list(_FakeProcesses.addrs)
    engine.initialize()
    seen = {"addrs": engine.addrs}

    consumed = []

    def weights():  # every rank must consume it (a sharded model's gather)
        for i in range(3):
            dist.barrier()  # a collective per tensor, as FSDP2's gather is
            consumed.append(i)
            yield f"w{i}", torch.full((2,), float(i))

    engine.update_weights_from_tensors(weights(), version=1)
    seen["consumed"] = consumed
    seen["version"] = engine.get_version()
    weights_dir = os.path.join(out_dir, "rollout_weights", "v1")
    seen["weights_written"] = os.path.isdir(weights_dir)
    engine.set_version(4)
    seen["version_after_set"] = engine.get_version()

    def fail(fn, *args):
        raise RolloutServerError("rollout server 127.0.0.1:7001: /collective_rpc returned 500")

    engine._run = fail  # type: ignore[method-assign]
    try:
        engine.update_weights_from_tensors(weights(), version=5)
        seen["error"] = None
    except RolloutServerError as exc:
        seen["error"] = str(exc)
    seen["version_after_error"] = engine.get_version()
    seen["calls"] = calls
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(seen, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
