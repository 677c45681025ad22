"""The start-up fingerprint processes compare (the multi-node runs are in
``tests/multiproc/test_multinode.py``)."""

from __future__ import annotations

import shutil

import pytest
from procs import REPO

from areal_m2po.api.cli_args import ConfigError, PPOConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.trainer.node_check import (
    Place,
    _raise_on_difference,
    check_processes_agree,
    fingerprint,
    path_digest,
)


def _cfg(tmp_path, *overrides: str) -> PPOConfig:
    return load_config(
        ["--config", str(REPO / "configs" / "tiny.yaml"), f"output_dir={tmp_path / 'run'}"]
        + list(overrides)
    )


def test_the_first_differing_key_and_node_are_named(tmp_path):
    places = [Place(0, 0, "a"), Place(0, 1, "a"), Place(1, 2, "b"), Place(1, 3, "b")]
    base = fingerprint(_cfg(tmp_path), str(tmp_path / "run"))
    other = fingerprint(_cfg(tmp_path, "seed=7", "actor.optimizer.lr=0.5"), str(tmp_path / "run"))
    _raise_on_difference([(p, base) for p in places])  # all agree
    with pytest.raises(ConfigError) as err:
        _raise_on_difference([(places[0], base), (places[1], base), (places[2], other)])
    assert str(err.value) == (
        "seed: differs between nodes: node 1 (rank 2, host b) has 7, node 0 (rank 0, host a) "
        "has 1; start every node with the same command, files and packages"
    )
    with pytest.raises(ConfigError, match=r"^extra: differs between nodes: node 1 \(rank 3"):
        _raise_on_difference([(places[0], base), (places[3], {**base, "extra": "1"})])


def test_files_named_by_path_keys_are_compared_by_contents(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    cfg = _cfg(tmp_path, f"train_dataset.path={data}", "train_dataset.type=rl")
    before = fingerprint(cfg, str(tmp_path / "run"))
    assert before["train_dataset.path (contents)"] == path_digest(str(data))
    assert "actor.path (contents)" not in before  # builtin:tiny is no local path
    assert "output_dir (contents)" not in before
    data.write_text('{"prompt": "1+2", "answer": "3"}\n')
    assert (
        fingerprint(cfg, str(tmp_path / "run"))["train_dataset.path (contents)"]
        != (before["train_dataset.path (contents)"])
    )
    assert before["torch version"] and before["recover checkpoint to resume"] == "none"


def test_a_folder_digest_covers_names_sizes_and_both_ends_of_each_file(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    big = bytearray(3 << 20)
    (folder / "model.safetensors").write_bytes(bytes(big))
    digest = path_digest(str(folder))
    shutil.copytree(folder, tmp_path / "copy")
    assert path_digest(str(tmp_path / "copy")) == digest  # an equal copy elsewhere agrees
    big[-1] = 1  # the last MiB is read
    (folder / "model.safetensors").write_bytes(bytes(big))
    assert path_digest(str(folder)) != digest
    (tmp_path / "copy" / "extra.txt").write_text("")
    assert path_digest(str(tmp_path / "copy")) != digest


def test_one_process_checks_nothing(tmp_path):
    check_processes_agree(_cfg(tmp_path), str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()
