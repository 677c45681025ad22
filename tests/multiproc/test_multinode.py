"""Two "nodes" on this machine: two ``accelerate launch --num_machines 2 --machine_rank 0/1
--main_process_ip 127.0.0.1`` commands (gloo, one process each), each node with its own empty
built-in model cache, both writing one shared ``output_dir``.

* (slow) ``backend: fsdp2``, 2 steps: the metrics equal those of one node running the same 2
  processes with the same seed.
* (slow) ``backend: ddp``: both nodes SIGKILLed right after the step-2 recover checkpoint, then
  both started again: steps 1-3 equal one node's 3 uninterrupted steps.
* (slow) ``rollout.mode=async``: the trainer on both nodes, a rollout server started as a
  third "node", reached through ``rollout.server_addrs``.
* Nodes that disagree (a config value; an ``output_dir`` that is not shared) stop at start-up,
  every process with one line naming the key and the node.
"""

from __future__ import annotations

import json
import re
import sys
import urllib.request

import pytest
import torch
from procs import (
    SUPPORT,
    TIMEOUT_S,
    check_exit,
    launch_command,
    node_launch_command,
    popen,
    read_metrics,
    tiny_train_args,
    train_command,
    untimed,
)

from areal_m2po.api.config_loader import load_config, save_config
from areal_m2po.engine.model_cache import REQUIRED_FILES
from areal_m2po.utils.net import free_port

pytestmark = pytest.mark.multiproc


def _two_nodes(tmp_path, args_of_node, tag: str, cwd_of_node=None) -> list:
    """Start node 0 and node 1 (``args_of_node(rank)``: the python arguments after
    ``accelerate launch``), each with its own empty model cache ``tmp_path/<tag>-cache<rank>``."""
    port = free_port()
    return [
        popen(
            [*node_launch_command(2, rank, 2, port), *args_of_node(rank)],
            cwd_of_node(rank) if cwd_of_node else tmp_path,
            AREAL_M2PO_CACHE=str(tmp_path / f"{tag}-cache{rank}"),
        )
        for rank in (0, 1)
    ]


def _assert_caches_built(tmp_path, tag: str) -> None:
    for rank in (0, 1):
        folder = tmp_path / f"{tag}-cache{rank}" / "tiny-v1"
        assert set(REQUIRED_FILES) <= {p.name for p in folder.iterdir()}, folder


@pytest.mark.slow
def test_two_fsdp2_nodes_train_as_one_node(tmp_path):
    extra = ("actor.backend=fsdp2",)
    one, two = tmp_path / "one", tmp_path / "two"
    procs = [
        popen([*launch_command(2), *train_command(one, 2, *extra)], tmp_path),
        *_two_nodes(tmp_path, lambda rank: train_command(two, 2, *extra), "fsdp2"),
    ]
    check_exit(procs)
    _assert_caches_built(tmp_path, "fsdp2")
    a, b = read_metrics(one), read_metrics(two)
    assert [r["step"] for r in b] == [1, 2]
    assert [untimed(r) for r in a] == [untimed(r) for r in b]
    assert (two / "recover" / "step_2" / "meta.json").exists()


@pytest.mark.slow
def test_two_ddp_nodes_killed_and_restarted_continue_as_one_node(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    config = tmp_path / "killed.yaml"
    save_config(load_config(train_command(killed, 3)[2:]), str(config))
    worker = str(SUPPORT / "recover_worker.py")
    reference = popen([*launch_command(2), *train_command(straight, 3)], tmp_path)
    nodes = _two_nodes(tmp_path, lambda rank: [worker, str(config), "2"], "ddp")
    for node in nodes:  # both nodes die by SIGKILL right after the step-2 checkpoint
        out, _ = node.communicate(timeout=TIMEOUT_S)
        assert node.returncode != 0 and "SIGKILL" in out, out[-3000:]
    _assert_caches_built(tmp_path, "ddp")
    assert [r["step"] for r in read_metrics(killed)] == [1, 2]
    assert not (killed / "recover" / "step_3").exists()
    restarted = _two_nodes(tmp_path, lambda rank: train_command(killed, 3), "ddp")
    check_exit([reference, *restarted])
    a, b = read_metrics(straight), read_metrics(killed)
    assert [r["step"] for r in b] == [1, 2, 3]
    assert [untimed(r) for r in a] == [untimed(r) for r in b]


@pytest.mark.slow
def test_async_trainer_on_two_nodes_with_a_rollout_server_node(tmp_path):
    port = free_port()
    server = popen(
        [sys.executable, "-m", "areal_m2po.rollout_server", "--model-path", "builtin:tiny"]
        + ["--port", str(port), "--num-threads", "1"],
        tmp_path,
        AREAL_M2PO_CACHE=str(tmp_path / "server-cache"),
    )
    out = tmp_path / "run"
    async_mode = (
        "rollout.mode=async",
        "rollout.staleness=0",
        "rollout.max_head_offpolicyness=1",
        f"rollout.server_addrs=[127.0.0.1:{port}]",
        "recover.mode=auto",
        "recover.freq_steps=2",
    )
    try:
        args = ["-m", "areal_m2po.train", *tiny_train_args(out, 2, *async_mode)]
        check_exit(_two_nodes(tmp_path, lambda rank: args, "async"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_model_info", timeout=30) as r:
            info = json.loads(r.read())
    finally:
        server.kill()
        server.communicate(timeout=60)
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/n_servers"] == 1
        assert r["actor/version"] - r["rollout/version_min"] <= 1  # max_head_offpolicyness
        assert r["m2po/n_valid"] > 0
    assert info["weight_version"] == "2"  # rank 0 loaded each new policy into the server
    ranks = torch.load(out / "recover" / "step_2" / "ranks.pt", weights_only=True)
    assert [r["rank"] for r in ranks] == [0, 1]


def _error_lines(procs) -> list[list[str]]:
    lines = []
    for p in procs:
        out, _ = p.communicate(timeout=TIMEOUT_S)
        # the trainer exits 2 (bad input); its launcher reports that and exits 1
        assert p.returncode != 0 and re.search(r"exitcode\s*:\s*2\b", out), out[-3000:]
        lines.append([ln for ln in out.splitlines() if ln.startswith("error:")])
    return lines


def test_nodes_that_disagree_stop_at_start_up_naming_the_key_and_node(tmp_path):
    """Node 1 with another learning rate; and, apart, two nodes whose relative output_dir
    names two different folders (each node starts in its own directory)."""
    lr = _two_nodes(
        tmp_path,
        lambda rank: train_command(tmp_path / "lr", 2, f"actor.optimizer.lr={1e-4 * (1 + rank)}"),
        "lr",
    )
    for rank in (0, 1):
        (tmp_path / f"cwd{rank}").mkdir()
    fs = _two_nodes(
        tmp_path,
        lambda rank: train_command("run", 2),
        "fs",
        cwd_of_node=lambda rank: tmp_path / f"cwd{rank}",
    )
    for lines in _error_lines(lr):
        assert len(lines) == 1, lines
        assert lines[0].startswith(
            "error: actor.optimizer.lr: differs between nodes: node 1 (rank 1, host "
        )
        assert "has 0.0002, node 0 (rank 0, host " in lines[0] and "has 0.0001;" in lines[0]
    for lines in _error_lines(fs):
        assert len(lines) == 1, lines
        assert lines[0].startswith("error: output_dir: node 1 (rank 1, host ")
        assert "every node needs output_dir on a filesystem all nodes share" in lines[0]
    # stopped before any model loaded: no node built its model cache
    assert not any((tmp_path / f"{tag}-cache{r}").exists() for tag in ("lr", "fs") for r in (0, 1))
    # nothing written: the output folders hold no config, metrics or marker file
    # (a folder made only for the output lock is removed with it)
    for run in (tmp_path / "cwd0" / "run", tmp_path / "lr"):
        assert not run.exists() or list(run.iterdir()) == []
    assert not (tmp_path / "cwd1" / "run").exists()
