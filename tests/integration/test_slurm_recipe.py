"""``examples/slurm/train.sbatch``'s async recipe without a cluster: the real script runs with
``srun`` and ``scontrol`` replaced by recorders (no server or trainer starts), and what each
step would have run is checked. Its rollout servers take a key (a new one per job unless one
is exported) and the run's weights folder; the trainer gets the same key; the key is on no
command line. (``tests/multiproc/test_slurm.py`` runs the script under a real Slurm.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"

FAKE_SRUN = r"""#!/bin/bash
# record one srun: drop its options, run a `bash -c SCRIPT ARG0 ARGS` step with ARG0 replaced
# by the recorder, record any other step directly; the script's SIGTERM to its backgrounded
# server step at exit must not cut the recording short (an ignored signal survives exec)
trap '' TERM
while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done
if [ "$1" = bash ] && [ "$2" = -c ]; then
    SLURM_NODEID=0 exec bash -c "$3" "$RECORDER" "${@:5}"
fi
exec "$RECORDER" "$@"
"""
RECORDER = r"""#!/bin/bash
printf '%s' "${AREAL_M2PO_SERVER_API_KEY:-}" > "$RECORD/step_$$.key"
printf '%s\n' "$@" > "$RECORD/step_$$.argv"
"""
FAKE_SCONTROL = r"""#!/bin/bash
case "$2" in
    hostnames) printf 'n1\nn2\n' ;;
    node) echo "NodeName=$3 NodeAddr=127.0.0.$([ "$3" = n1 ] && echo 1 || echo 2)" ;;
esac
"""


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _run(tmp_path: Path, key: str | None) -> list[tuple[list[str], str]]:
    bin_dir, record = tmp_path / "bin", tmp_path / "record"
    bin_dir.mkdir()
    record.mkdir()
    _script(bin_dir / "srun", FAKE_SRUN)
    _script(bin_dir / "scontrol", FAKE_SCONTROL)
    recorder = _script(tmp_path / "recorder", RECORDER)
    env = {k: v for k, v in os.environ.items() if k != "AREAL_M2PO_SERVER_API_KEY"}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        RECORD=str(record),
        RECORDER=str(recorder),
        SLURM_JOB_NUM_NODES="2",
        SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="n[1-2]",
        ROLLOUT_NODES="1",
        NPROC_PER_NODE="1",
        PYTHON=sys.executable,
    )
    if key is not None:
        env["AREAL_M2PO_SERVER_API_KEY"] = key
    out = str(tmp_path / "run")
    done = subprocess.run(
        ["bash", str(SBATCH), "--config", "configs/tiny.yaml", f"output_dir={out}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    steps = sorted(record.glob("step_*.argv"))
    return [(p.read_text().splitlines(), p.with_suffix(".key").read_text()) for p in steps]


@pytest.mark.parametrize("exported", [None, "the-exported-key"], ids=["new-key", "exported"])
def test_the_async_recipe_keys_its_servers_and_gives_them_the_weights_root(tmp_path, exported):
    steps = _run(tmp_path, exported)
    assert len(steps) == 2  # the servers' step, then the trainer's
    (server, server_key), (trainer, trainer_key) = steps
    assert server[:2] == ["-m", "areal_m2po.rollout_server"]
    weights_root = server[server.index("--weights-root") + 1]
    assert weights_root == str(tmp_path / "run" / "rollout_weights")
    assert trainer[:3] == [sys.executable, "-m", "areal_m2po.train"]
    assert "rollout.server_addrs=[127.0.0.2:30000]" in trainer
    assert server_key and server_key == trainer_key
    if exported is not None:
        assert server_key == exported
    else:
        assert len(server_key) >= 40  # secrets.token_urlsafe(32)
    for argv in (server, trainer):
        assert not any(server_key in arg for arg in argv)  # off every command line


def test_the_recipe_parses():
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
