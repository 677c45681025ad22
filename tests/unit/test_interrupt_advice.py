"""Ctrl-C's one line says how to continue, and only what works: resuming names the last recover
checkpoint; without one (recover.mode disabled) the line says the run cannot be resumed,
since ``recover.mode=auto`` is then refused for a folder that holds a run."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.entry import EXIT_INTERRUPTED, config_main

REPO = Path(__file__).resolve().parents[2]


def _interrupted(*args: str) -> None:
    raise KeyboardInterrupt


def _line(capsys: pytest.CaptureFixture[str], out: Path) -> str:
    argv = ["--config", str(REPO / "configs" / "tiny.yaml"), f"output_dir={out}"]
    assert config_main(argv, PPOConfig, _interrupted) == EXIT_INTERRUPTED
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: interrupted (Ctrl-C); ")
    return lines[0]


def test_without_a_recover_checkpoint_resuming_is_not_advised(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    line = _line(capsys, tmp_path / "run")
    assert "recover.mode=auto resumes" not in line
    assert "no recover checkpoint was written" in line and "cannot be resumed" in line
    assert "overwrite_output_dir=true" in line


def test_with_a_recover_checkpoint_resuming_names_it(tmp_path, capsys):
    step = tmp_path / "run" / "recover" / "step_3"
    step.mkdir(parents=True)
    (step / "meta.json").write_text("{}")
    line = _line(capsys, tmp_path / "run")
    assert line.endswith(f"recover.mode=auto resumes from the last recover checkpoint, {step}")


@pytest.mark.parametrize("made", [False, True])
def test_interrupted_during_start_up_the_same_command_starts_again(tmp_path, capsys, made):
    """Issue 57: Ctrl-C while the models loaded advised overwrite_output_dir=true for a folder
    that was never made (or holds nothing of a run)."""
    if made:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.yaml").write_text("seed: 1\n")
    line = _line(capsys, tmp_path / "run")
    assert "overwrite_output_dir" not in line and "recover.mode" not in line
    assert line.endswith(
        f"no metrics or checkpoint were written in {tmp_path / 'run'}: the same command starts again"
    )
