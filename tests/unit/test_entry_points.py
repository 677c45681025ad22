"""The command lines and dotted paths users name stay working when the code moves: the HF
rollout server's ``python -m areal_m2po.rollout_server``, the vLLM server's
``python -m areal_m2po.rollout.vllm_server_main`` and the worker-extension class they pass to
vLLM (``--worker-extension-cls``)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from procs import REPO, subprocess_env


def test_the_worker_extension_path_names_the_reload_extension():
    from areal_m2po.rollout.engines.vllm.worker_extension import WeightReloadExtension
    from areal_m2po.rollout.servers.launch import WORKER_EXTENSION

    assert WORKER_EXTENSION == "areal_m2po.rollout.vllm_worker_ext.WeightReloadExtension"
    module, _, name = WORKER_EXTENSION.rpartition(".")  # how vLLM resolves it
    assert getattr(importlib.import_module(module), name) is WeightReloadExtension
    assert callable(WeightReloadExtension.areal_reload_weights)


@pytest.mark.parametrize(
    "module, flag",
    [
        ("areal_m2po.rollout_server", "--model-path"),
        ("areal_m2po.rollout.vllm_server_main", "--parent-pid"),
    ],
)
def test_server_command_lines_answer_help(module, flag):
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert flag in proc.stdout
