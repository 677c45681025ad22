"""A user's mistakes starting ``python -m areal_m2po.rollout_server`` by hand: each stops with
status 2 and one line naming the flag, before the model loads (no traceback, no hub error)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from procs import REPO, subprocess_env

from areal_m2po.rollout.common.guard import API_KEY_ENV


def _server(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in subprocess_env().items() if k != API_KEY_ENV}
    return subprocess.run(
        [sys.executable, "-m", "areal_m2po.rollout_server", *args],
        cwd=REPO,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _only_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return lines[-1]


@pytest.mark.parametrize("port", ["99999", "-1", "http"])
def test_a_port_out_of_range_is_refused_by_the_parser(port):
    line = _only_error_line(_server("--model-path", "builtin:tiny", "--port", port))
    assert "argument --port" in line and ("0-65535" in line or "integer" in line), line


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_a_public_host_without_a_key_is_refused(host):
    line = _only_error_line(_server("--model-path", "builtin:tiny", "--host", host))
    assert line.startswith(f"error: --host {host}: not a loopback address, and no key"), line
    assert API_KEY_ENV in line


def test_a_missing_local_model_path_names_the_flag(tmp_path):
    missing = tmp_path / "nomodel"
    line = _only_error_line(_server("--model-path", str(missing)))
    assert line == f"error: --model-path: {missing} does not exist (a local model directory)"


def test_a_model_path_under_home_is_expanded(tmp_path):
    line = _only_error_line(_server("--model-path=~/nomodel", HOME=str(tmp_path)))
    assert (
        line
        == f"error: --model-path: {tmp_path / 'nomodel'} does not exist (a local model directory)"
    )


def test_a_missing_tokenizer_path_and_a_file_as_model_are_named(tmp_path):
    line = _only_error_line(
        _server("--model-path", "builtin:tiny", "--tokenizer-path", str(tmp_path / "tok"))
    )
    assert line.startswith("error: --tokenizer-path: "), line
    afile = tmp_path / "model.bin"
    afile.write_bytes(b"")
    line = _only_error_line(_server("--model-path", str(afile)))
    assert line == f"error: --model-path: {afile} is a file; a model is a directory or a hub id"
    assert os.path.exists(afile)


def test_a_port_in_use_is_named_before_the_model_loads():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = _server("--model-path", "builtin:tiny", "--port", str(port))
    line = _only_error_line(proc)
    assert line.startswith(f"error: --host 127.0.0.1 --port {port}: cannot listen there ("), line
    assert "Loading weights" not in proc.stderr
