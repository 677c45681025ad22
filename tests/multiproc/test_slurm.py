"""``examples/slurm/train.sbatch`` under a real Slurm: a two-node cluster on this machine
(munged, slurmctld and two slurmd from Debian's packages, ``tests/support/slurm/up.sh``),
started and stopped by this test (by pid, also when it fails), the packages installed with
apt-get when missing.

Where Slurm is missing and cannot be installed (not root, no apt-get) the test is skipped,
naming why; with ``AREAL_M2PO_REQUIRE_SLURM=1`` (``.ci/run``) it fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from procs import REPO, SUPPORT, process_table, read_metrics, subprocess_env, tiny_train_args

from areal_m2po.engine.model_cache import REQUIRED_FILES

pytestmark = [pytest.mark.slow, pytest.mark.multiproc]

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel")
SLURM_SCRIPTS = SUPPORT / "slurm"
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
JOB_TIMEOUT_S = 600


def _unavailable(reason: str) -> None:
    if os.environ.get("AREAL_M2PO_REQUIRE_SLURM") == "1":
        pytest.fail(f"AREAL_M2PO_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
"""PATH with the system folders the daemons are installed in."""


def _install_slurm() -> None:
    """Install Debian's Slurm and munge packages unless their programs are on PATH."""
    if all(shutil.which(p, path=SEARCH_PATH) for p in PROGRAMS):
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        _unavailable(
            "Slurm is not installed and this test cannot install it (it needs root and "
            f"apt-get): apt-get install {' '.join(PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES],
    ):
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            _unavailable(f"{' '.join(cmd)} failed: {(res.stdout + res.stderr)[-2000:]}")


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive TCP ports that are free on 127.0.0.1 now."""
    for base in range(20000 + os.getpid() % 20000, 60000, 7):
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, str]]:
    """A two-node Slurm cluster under a short folder in /tmp (its daemons' Unix sockets live
    there: their paths must stay under 108 bytes); yields what a client adds to its
    environment (``SLURM_CONF``; ``D``: the cluster's folder)."""
    _install_slurm()
    state = tempfile.mkdtemp(prefix="slurm-", dir="/tmp")
    port = _free_ports(3)  # slurmctld's, then one per slurmd
    client = {"D": state, "SLURM_CONF": f"{state}/slurm.conf"}
    env = {**os.environ, **client, "N": "2", "CTLD_PORT": str(port), "SLURMD_PORT": str(port + 1)}
    env["PATH"] = SEARCH_PATH
    try:
        up = subprocess.run(
            ["bash", str(SLURM_SCRIPTS / "up.sh")], env=env, capture_output=True, text=True
        )
        assert up.returncode == 0, up.stdout + up.stderr
        yield client
    finally:
        subprocess.run(["bash", str(SLURM_SCRIPTS / "down.sh")], env=env, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


def _daemon_logs(state: str) -> str:
    """The end of every daemon's log, for a failure message."""
    return "".join(
        f"\n--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:])
        for log in sorted(Path(state, "log").glob("*.log"))
    )


def _sbatch(slurm: dict[str, str], workdir: Path, args: list[str], **env: str) -> str:
    """Run ``sbatch --wait -N 2 train.sbatch *args`` from ``workdir/job`` with ``env``; the job's
    output (the test fails with it, and the daemons' logs, unless the job succeeded)."""
    job_dir = workdir / "job"
    job_dir.mkdir()
    env = {**subprocess_env(), **slurm, "PYTHON": sys.executable, **env}
    res = subprocess.run(
        ["sbatch", "--wait", "-N", "2", "-o", "slurm-%j.out", str(SBATCH), *args],
        cwd=job_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )
    job = re.search(r"Submitted batch job (\d+)", res.stdout)
    assert job, res.stdout + res.stderr + _daemon_logs(slurm["D"])
    out_file = job_dir / f"slurm-{job.group(1)}.out"
    log = out_file.read_text() if out_file.exists() else "(no job output)"
    assert res.returncode == 0, log[-5000:] + res.stderr + _daemon_logs(slurm["D"])
    return log


def test_sbatch_trains_two_steps_on_two_nodes(slurm, tmp_path):
    """``sbatch --wait -N 2 train.sbatch --config configs/tiny.yaml KEY=VALUE ...``: one
    process per node, one shared model cache and output_dir (as on a cluster's shared home)."""
    out, cache = tmp_path / "shared" / "run", tmp_path / "shared" / "cache"
    args = tiny_train_args(out, 2, "recover.mode=auto", "recover.freq_steps=2")
    args.append("trial_name=two nodes")  # one argument with a space: passed on unchanged
    log = _sbatch(slurm, tmp_path, args, AREAL_M2PO_CACHE=str(cache), NPROC_PER_NODE="1")
    assert "2 training node(s) x 1 process(es), main 127.0.0.1:" in log
    assert [r["step"] for r in read_metrics(out)] == [1, 2]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["trial_name"] == "two nodes" and config["total_train_steps"] == 2
    meta = yaml.safe_load((out / "recover" / "step_2" / "meta.json").read_text())
    assert meta["world_size"] == 2
    assert set(REQUIRED_FILES) <= {p.name for p in (cache / "tiny-v1").iterdir()}
    # the training step ran one task on each node
    for node in ("n1", "n2"):
        slurmd_log = Path(slurm["D"], "log", f"slurmd-{node}.log").read_text()
        assert re.search(rf"launch task StepId={job_id(log)}\.\d+ ", slurmd_log), node


def test_sbatch_with_a_rollout_node_trains_async(slurm, tmp_path):
    """``ROLLOUT_NODES=1``: node 2 serves the policy, the trainer on node 1 reaches it through
    the rollout.server_addrs the script appends; the server stops when training ends."""
    out, cache = tmp_path / "shared" / "run", tmp_path / "shared" / "cache"
    port = str(_free_ports(1))
    async_mode = (
        "rollout.mode=async",
        "rollout.staleness=0",
        "rollout.max_head_offpolicyness=1",
        "rollout.server_threads=1",
    )
    log = _sbatch(
        slurm,
        tmp_path,
        tiny_train_args(out, 2, *async_mode),
        AREAL_M2PO_CACHE=str(cache),
        ROLLOUT_NODES="1",
        ROLLOUT_PORT=port,
        ROLLOUT_SERVER_ARGS="--num-threads 1",
    )
    assert "1 training node(s) x 1 process(es)" in log and "1 rollout node(s)" in log
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollout/n_servers"] == 1 for r in records)
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["rollout"]["server_addrs"] == [f"127.0.0.1:{port}"]
    left = [argv for _, argv, state, _ in process_table() if state != "Z" and port.encode() in argv]
    assert left == [], left


def job_id(log: str) -> str:
    match = re.search(r"train.sbatch: job (\d+):", log)
    assert match, log[-2000:]
    return match.group(1)
