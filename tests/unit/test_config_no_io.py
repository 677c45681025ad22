"""Building a config object checks values only: no file is opened or looked at, no package is
looked up or imported (the start-up checks of trainer/preflight.py do that, before any model
loads). Each trainer's root config is built, with sections that name real local files, while
``open``, ``os.stat``/``lstat``/``listdir``/``scandir``, ``importlib.util.find_spec`` and
``builtins.__import__`` record every call."""

from __future__ import annotations

import builtins
import importlib.util
import io
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from areal_m2po.api.cli_args import (
    ActorConfig,
    DPOConfig,
    PPOConfig,
    PreferenceDatasetConfig,
    RolloutConfig,
    RWConfig,
    RWModelConfig,
    SFTConfig,
    SFTDatasetConfig,
    TrainEngineConfig,
    VLLMConfig,
)


@contextmanager
def no_io(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Record (not refuse: a refusal could be swallowed by an ``except OSError``) every call of
    the guarded functions while the block runs; yields the list of calls."""
    calls: list[str] = []

    def recording(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            calls.append(f"{name}{args[:1]!r}")
            return real(*args, **kwargs)

        return guarded

    with monkeypatch.context() as patch:
        for owner, name, label in (
            (builtins, "open", "open"),
            (io, "open", "io.open"),
            (os, "stat", "os.stat"),
            (os, "lstat", "os.lstat"),
            (os, "listdir", "os.listdir"),
            (os, "scandir", "os.scandir"),
            (importlib.util, "find_spec", "find_spec"),
            (builtins, "__import__", "import"),
        ):
            patch.setattr(owner, name, recording(label, getattr(owner, name)))
        yield calls


@pytest.fixture
def local_files(tmp_path: Path) -> dict[str, str]:
    """A model folder whose config.json names a small max_position_embeddings (the old config
    check read it), a preference file and an SFT file."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"prompt": "a", "completion": "b"}\n')
    return {"model": str(model), "pairs": str(pairs), "sft": str(sft)}


def _ppo(files: dict[str, str]) -> Any:
    return PPOConfig(
        actor=ActorConfig(path=files["model"], m2_threshold=0.04, use_decoupled_loss=True),
        tokenizer_path=files["model"],
        rollout=RolloutConfig(backend="vllm", staleness=1, vllm=VLLMConfig(max_model_len=2048)),
    )


def _rw(files: dict[str, str]) -> Any:
    return RWConfig(
        model=RWModelConfig(path=files["model"]),
        train_dataset=PreferenceDatasetConfig(path=files["pairs"]),
        valid_dataset=PreferenceDatasetConfig(path=files["pairs"]),
    )


def _sft(files: dict[str, str]) -> Any:
    return SFTConfig(
        model=TrainEngineConfig(path=files["model"]),
        train_dataset=SFTDatasetConfig(path=files["sft"]),
    )


def _dpo(files: dict[str, str]) -> Any:
    return DPOConfig(
        model=TrainEngineConfig(path=files["model"]),
        ref_path=files["model"],
        train_dataset=PreferenceDatasetConfig(path=files["pairs"]),
    )


@pytest.mark.parametrize("build", [_ppo, _rw, _sft, _dpo], ids=["ppo", "rw", "sft", "dpo"])
def test_building_a_config_does_no_io(
    build: Callable[[dict[str, str]], Any],
    local_files: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with no_io(monkeypatch) as calls:
        config = build(local_files)
    assert calls == []
    assert config.output_dir  # built, and derived its output_dir


def test_the_guard_sees_file_and_package_lookups(
    local_files: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard is live: the start-up checks' own reads are recorded."""
    from areal_m2po.trainer.preflight import max_positions_of

    with no_io(monkeypatch) as calls:
        assert max_positions_of(local_files["model"]) == 4096
        importlib.util.find_spec("json")
    assert any(c.startswith("open") for c in calls) and any("find_spec" in c for c in calls)
