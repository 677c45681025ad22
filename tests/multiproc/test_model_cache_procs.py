"""A built-in model asked for by several processes on an empty cache: the ranks of one
``accelerate launch`` (rank 1 first, then both at once) and unrelated processes started
together. Every process gets the same complete folder, built by one of them."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from procs import SUPPORT, TIMEOUT_S, check_exit, launch_command, popen

from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.model_cache import REQUIRED_FILES
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

pytestmark = pytest.mark.multiproc

WORKER = str(SUPPORT / "cache_worker.py")


def _seeded_checksum() -> float:
    model = build_tiny_llama(len(build_tiny_tokenizer()))
    return sum(float(t.double().sum()) for t in model.state_dict().values())


def _assert_complete(got: dict, cache: Path) -> None:
    assert got["path"] == str(cache / "tiny-v1")
    assert set(REQUIRED_FILES) <= set(got["files"])
    assert got["checksum"] == pytest.approx(_seeded_checksum(), rel=1e-12)


def test_two_ranks_of_one_launch_on_an_empty_cache(tmp_path):
    out, root = tmp_path / "out", tmp_path / "caches"
    out.mkdir()
    check_exit([popen([*launch_command(2), WORKER, "launch", str(out), str(root)], tmp_path)])
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    for result in ranks:
        assert result["world"] == 2
        _assert_complete(result["rank1_first"], root / "rank1_first")
        _assert_complete(result["together"], root / "together")
    # why rank 1 cannot build with save_pretrained: under the process group it writes no
    # config and no weights (only the tokenizer files, saved separately)
    written = ranks[1]["written"]
    assert not {"config.json", "model.safetensors"} & set(written["save_pretrained_rank1"])
    assert set(REQUIRED_FILES) <= set(written["save_model_folder_rank1"])


def test_two_unrelated_processes_started_together_build_once(tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    outs = [tmp_path / f"p{i}.json" for i in (0, 1)]
    procs = [
        popen([sys.executable, WORKER, "together", str(o), str(cache), str(go)], tmp_path)
        for o in outs
    ]
    deadline = time.monotonic() + TIMEOUT_S
    while not all(Path(f"{o}.ready").exists() for o in outs):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            p.communicate()[0][-3000:] for p in procs if p.poll() is not None
        ]
        time.sleep(0.05)
    go.touch()
    logs = []
    for p in procs:
        log, _ = p.communicate(timeout=TIMEOUT_S)
        assert p.returncode == 0, log[-4000:]
        logs.append(log)
    for o in outs:
        _assert_complete(json.loads(o.read_text()), cache)
    built = [log.count("building builtin:tiny into") for log in logs]
    assert sorted(built) == [0, 1], logs  # one process built, the other loaded its folder
    assert sorted(p.name for p in cache.iterdir()) == [".tiny-v1.lock", "tiny-v1"]
