"""A user's workflow or agent that breaks its contract stops the run with one ``error:`` line
(status 1) naming ``rollout.workflow`` and, for an exception, the file and line in the user's
code, through the real entry point: no traceback (issue 46). Also the one-line helpers on
their own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from procs import REPO, subprocess_env

from areal_m2po.api.errors import RunError, WorkflowError
from areal_m2po.rollout.episode_errors import episode_failure, one_line, raise_site

TIMEOUT_S = 300

WORKFLOWS = textwrap.dedent(
    """
    from areal_m2po.api.workflow_api import RolloutWorkflow


    class Raises(RolloutWorkflow):
        def __init__(self, context, **kwargs):
            self.context = context

        async def arun_episode(self, engine, record):
            raise ValueError("boom in my workflow")


    class ReturnsInt(Raises):
        async def arun_episode(self, engine, record):
            return 5


    class ReturnsNone(Raises):
        async def arun_episode(self, engine, record):
            return None
    """
)


def _run_tiny(tmp_path: Path, workflow: str) -> subprocess.CompletedProcess:
    """``python -m areal_m2po.train`` of the tiny config with ``rollout.workflow=workflow``
    (a class of the module ``my_workflows`` written into ``tmp_path``)."""
    (tmp_path / "my_workflows.py").write_text(WORKFLOWS)
    env = subprocess_env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_m2po.train",
            "--config",
            str(REPO / "configs" / "tiny.yaml"),
            f"rollout.workflow=my_workflows:{workflow}",
            f"output_dir={tmp_path / 'run'}",
            "num_threads=1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize(
    ("workflow", "expected"),
    [
        (
            "Raises",
            "error: rollout.workflow my_workflows:Raises: an episode raised ValueError: "
            "boom in my workflow (at {dir}/my_workflows.py:10)",
        ),
        (
            "ReturnsInt",
            "error: rollout.workflow my_workflows:ReturnsInt: arun_episode returned int, "
            "not a Trajectory or None",
        ),
        (
            "ReturnsNone",
            "error: rollout.workflow my_workflows:ReturnsNone: every group of a batch was "
            "dropped (4 groups); nothing to train on",
        ),
    ],
)
def test_a_broken_workflow_stops_the_run_in_one_line(
    tmp_path: Path, workflow: str, expected: str
) -> None:
    proc = _run_tiny(tmp_path, workflow)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [expected.format(dir=tmp_path)], proc.stderr[-3000:]


def _raise_in_user_code(tmp_path: Path) -> BaseException:
    """An exception raised by a function of a file outside the package (the user's code)."""
    user = tmp_path / "user_code.py"
    user.write_text("def fail():\n    raise KeyError('answer')\n")
    namespace: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), namespace)
    try:
        namespace["fail"]()
    except KeyError as exc:
        return exc
    raise AssertionError("unreachable")


def test_the_line_names_the_users_file_and_line_through_a_chain(tmp_path: Path) -> None:
    inner = _raise_in_user_code(tmp_path)
    try:
        raise RuntimeError("wrapped\nsecond line") from inner
    except RuntimeError as outer:
        chained = outer
    assert raise_site(chained) == f"{tmp_path / 'user_code.py'}:2"
    assert one_line(chained) == f"RuntimeError: wrapped ... (at {tmp_path / 'user_code.py'}:2)"
    error = episode_failure("my:wf", chained)
    assert isinstance(error, WorkflowError) and isinstance(error, RunError)
    assert str(error) == (
        f"rollout.workflow my:wf: an episode raised RuntimeError: wrapped ... "
        f"(at {tmp_path / 'user_code.py'}:2)"
    )


def test_a_library_error_names_its_caller_and_a_workflow_error_passes_through() -> None:
    try:
        int("x")  # raised by the standard library, called from this test file
    except ValueError as exc:
        # the test file itself is outside the package: it is the "user's" frame
        assert raise_site(exc) == f"{__file__}:{exc.__traceback__.tb_lineno}"
    error = WorkflowError("rollout.workflow w: given")
    assert episode_failure("w", error) is error
