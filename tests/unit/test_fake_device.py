"""The fake-accelerator tests (``fake_*_cases.py`` beside this file), each module in a child
pytest process of its own.

Why a child: the fake device is PyTorch's ``privateuseone`` backend renamed (see
tests/support/fake_device.py); the renaming is for the life of the process, makes
``torch.accelerator.current_accelerator()`` name it (transformers' default device type
follows), and a backward pass on it needs the backend registered before the process's first
backward (autograd sizes its device queues once). A fresh process keeps all three away from the
other tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from procs import REPO, subprocess_env

HERE = REPO / "tests" / "unit"


@pytest.mark.parametrize("cases", ["fake_algo_cases.py", "fake_step_cases.py"])
def test_fake_device_cases(cases):
    env = subprocess_env()
    env["AREAL_M2PO_FAKE_DEVICE"] = "1"  # fake_device.register_fake_backend refuses without it
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / cases)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, f"{cases} failed in its process:\n{tail}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout, tail
