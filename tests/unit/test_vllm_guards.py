"""The vLLM side of issue 46 without vLLM: a guarded flag is refused in every spelling vLLM's
parser would take for it (through the real server entry point, before vLLM is imported), and
the weight-reload extension reads only resolved files below ``--weights-root`` and refuses
non-finite tensors before it touches the model."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from areal_m2po.rollout.common.guard import WEIGHTS_ROOT_ENV
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
