"""The vLLM side of issue 46 without vLLM: a guarded flag is refused in every spelling vLLM's
parser would take for it (through the real server entry point, before vLLM is imported), and
the weight-reload extension reads only files below ``--weights-root``, each from the one
descriptor it checked, and refuses non-finite tensors and tensors of other shapes than the
served checkpoint's before it touches the model."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from areal_m2po.rollout.common.guard import WEIGHTS_ROOT_ENV, below_root
from areal_m2po.rollout.common.server_args import refused_server_arg
from areal_m2po.rollout.common.weight_files import WEIGHTS_FILE, write_weights
from areal_m2po.rollout.engines.vllm.worker_extension import WeightReloadExtension

REFUSED = [
    ["--api_key", "k"],
    ["--api-k", "k"],
    ["--api-key=k"],
    ["--API-KEY", "k"],
    ["--hos", "0.0.0.0"],
    ["--ho=0.0.0.0"],
    ["--config", "file.yaml"],
    ["--conf", "file.yaml"],
]


@pytest.mark.parametrize("args", REFUSED, ids=[" ".join(a) for a in REFUSED])
def test_a_spelling_of_a_guarded_flag_stops_the_vllm_server_entry_point(args):
    """Old code took all of these but ``--api-key=k`` and went on to import vLLM."""
    cmd = [sys.executable, "-m", "areal_m2po.rollout.vllm_server_main"]
    cmd += ["--parent-pid", str(os.getpid()), "--", "--model", "m", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    flag = args[0].split("=")[0]
    assert f"{flag}: reaches vLLM's" in done.stderr
    assert "Traceback" not in done.stderr


def test_exact_and_unrelated_flags_pass():
    ok = ["--host", "127.0.0.1", "--api-server-count", "1", "--config-format", "auto", "--hf"]
    assert refused_server_arg(ok) is None
    assert refused_server_arg(["--host=::1", "--port", "1"]) is None


class _Worker(WeightReloadExtension):
    """The extension's ``self``: a served model of two tensors that records its reloads."""

    def __init__(self) -> None:
        self._areal_shapes = {"a": (2, 2), "b": (3,)}
        self.reloaded: list[str] = []

    def reload_weights(self, weights_iterator) -> None:
        self.reloaded = [name for name, _ in weights_iterator]


def _state(**changes):
    state = {"a": torch.ones(2, 2), "b": torch.zeros(3)}
    state.update(changes)
    return state


def test_the_reload_reads_only_resolved_files_below_the_root(tmp_path, monkeypatch):
    root = tmp_path / "root"
    monkeypatch.setenv(WEIGHTS_ROOT_ENV, str(root))
    inside = write_weights(_state(), str(root), 1)
    worker = _Worker()
    assert worker.areal_reload_weights(inside) == {"n_tensors": 2}
    outside = write_weights(_state(), str(tmp_path / "elsewhere"), 2)
    folder = root / "v2"
    folder.mkdir()
    os.symlink(os.path.join(outside, WEIGHTS_FILE), folder / WEIGHTS_FILE)
    worker.reloaded = []
    with pytest.raises(PermissionError, match="resolves outside the server's --weights-root"):
        worker.areal_reload_weights(str(folder))
    assert worker.reloaded == []


def test_a_nan_tensor_is_refused_before_the_model_is_touched(tmp_path, monkeypatch):
    monkeypatch.setenv(WEIGHTS_ROOT_ENV, str(tmp_path))
    bad = _state(b=torch.tensor([0.0, float("nan"), 1.0]))
    path = write_weights(bad, str(tmp_path), 3)
    worker = _Worker()
    with pytest.raises(ValueError, match="tensor 'b' holds NaN or infinite values"):
        worker.areal_reload_weights(path)
    assert worker.reloaded == []


class _ServedWorker(WeightReloadExtension):
    """A worker whose served checkpoint is the folder ``model`` (shapes read from it)."""

    def __init__(self, model: str) -> None:
        self.model_config = SimpleNamespace(model=model, hf_config=SimpleNamespace())
        self.reloaded: list[str] = []

    def reload_weights(self, weights_iterator) -> None:
        self.reloaded = [name for name, _ in weights_iterator]


def test_a_tensor_of_another_shape_is_refused_before_the_model_is_touched(tmp_path, monkeypatch):
    """The shapes come from the served checkpoint's headers; old code handed the tensors to
    vLLM, whose loaders then copied into a model of other shapes."""
    monkeypatch.setenv(WEIGHTS_ROOT_ENV, str(tmp_path))
    served = write_weights(_state(), str(tmp_path / "served"), 0)
    worker = _ServedWorker(served)
    assert worker.areal_reload_weights(write_weights(_state(), str(tmp_path), 1)) == {
        "n_tensors": 2
    }
    assert worker.reloaded == ["a", "b"]
    worker.reloaded = []
    path = write_weights(_state(b=torch.zeros(4)), str(tmp_path), 2)
    with pytest.raises(
        ValueError, match=r"tensor 'b' has shape \[4\], the served model's is \[3\]"
    ):
        worker.areal_reload_weights(path)
    assert worker.reloaded == []


def test_a_file_swapped_for_an_outside_link_after_its_check_is_never_read(tmp_path, monkeypatch):
    """The attacker wins the race every time: right after a file is checked below the root
    it becomes a link to a file outside. Old code opened the resolved path again and loaded
    the outside tensors; now the file checked is the file read."""
    root = tmp_path / "root"
    monkeypatch.setenv(WEIGHTS_ROOT_ENV, str(root))
    inside = write_weights(_state(), str(root), 1)
    outside = write_weights(_state(a=torch.full((2, 2), 7.0)), str(tmp_path / "elsewhere"), 2)
    file = os.path.join(inside, WEIGHTS_FILE)

    def racing(path, where):
        ok = below_root(path, where)
        if str(path).endswith(".safetensors") and not os.path.islink(file):
            os.remove(file)
            os.symlink(os.path.join(outside, WEIGHTS_FILE), file)
        return ok

    for name in (
        "areal_m2po.rollout.engines.vllm.worker_extension",
        "areal_m2po.rollout.common.weight_reader",
    ):
        with contextlib.suppress(ImportError):
            module = importlib.import_module(name)
            if hasattr(module, "below_root"):
                monkeypatch.setattr(module, "below_root", racing)
    loaded: dict[str, torch.Tensor] = {}

    class _Recording(_Worker):
        def reload_weights(self, weights_iterator) -> None:
            loaded.update(weights_iterator)

    _Recording().areal_reload_weights(inside)
    assert os.path.islink(file)  # the swap happened
    assert torch.equal(loaded["a"], torch.ones(2, 2))
