"""An agent that does not import stops the run in one line before any model loads (found in
the new-user sweep: ``--config examples/agent.yaml`` without ``PYTHONPATH=examples`` stopped
only after the policy had loaded)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from procs import REPO, subprocess_env


@pytest.mark.parametrize(
    "workflow", ["agent", "areal_m2po.rollout.workflows.agent.workflow:AgentWorkflow"]
)
def test_an_agent_module_off_the_path_stops_before_the_models_load(tmp_path, workflow):
    proc = subprocess.run(
        [
            sys.executable, "-m", "areal_m2po.train",
            "--config", str(REPO / "configs" / "tiny.yaml"),
            f"output_dir={tmp_path / 'run'}", "num_threads=1",
            f"rollout.workflow={workflow}",
            "rollout.workflow_kwargs={agent: 'not_on_the_path_q:agent'}",
        ],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-3000:]  # no "Loading weights", no traceback
    assert lines[0].startswith(
        "error: rollout.workflow_kwargs.agent: 'not_on_the_path_q:agent': cannot import module"
    ), lines[0]
