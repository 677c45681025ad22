"""A run's folder is its own (issue 46), through the real entry point on the tiny model:

* a second run into a folder a live run holds stops in one line naming the first (pid, host);
* a resume whose training keys differ from the recover checkpoint's is refused in one line
  naming each changed key, unless ``recover.allow_changed_keys=true``, and then
  ``config.yaml`` names the changes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml
from procs import REPO, read_metrics, subprocess_env

TINY_RL = str(REPO / "configs" / "tiny.yaml")
TIMEOUT_S = 300


def _train(*args: str) -> list[str]:
    return [sys.executable, "-m", "areal_m2po.train", "--config", TINY_RL, "num_threads=1", *args]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _train(*args), cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip


def _lr(out: Path) -> float:
    """``actor.optimizer.lr`` of the run's ``config.yaml``."""
    return yaml.safe_load((out / "config.yaml").read_text())["actor"]["optimizer"]["lr"]


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error: ")]


def test_a_second_run_into_a_folder_in_use_stops_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = subprocess.Popen(
        _train(f"output_dir={out}", "total_train_steps=1000", "evaluator.eval_at_end=false"),
        cwd=REPO, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not (out / "metrics.jsonl").exists():  # the first run is training
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        second = _run(f"output_dir={out}", "total_train_steps=1")
    finally:
        first.kill()
        first.wait(timeout=60)
    assert second.returncode == 2, second.stderr[-3000:]
    assert "Traceback" not in second.stderr
    (line,) = _error_lines(second)
    assert line.startswith(f"error: output_dir: {out} is in use by the run of pid {first.pid} on ")
    # the first run's metrics are its own: no step twice
    steps = [m["step"] for m in read_metrics(out)]
    assert len(steps) == len(set(steps))


def test_a_resume_with_changed_training_keys_is_refused_unless_allowed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    common = (f"output_dir={out}", "recover.mode=auto", "recover.freq_steps=1")
    done = _run(*common, "total_train_steps=2")
    assert done.returncode == 0, done.stderr[-3000:]

    changed = _run(*common, "total_train_steps=3", "actor.optimizer.lr=2e-4", "actor.eps_clip=0.3")
    assert changed.returncode == 2, changed.stderr[-3000:]
    (line,) = _error_lines(changed)
    assert line.startswith("error: recover.mode: recover checkpoint ")
    assert "written with other training keys: actor.optimizer.lr 0.0001 -> 0.0002, " in line
    assert "actor.eps_clip 0.2 -> 0.3; recover.allow_changed_keys=true resumes" in line
    assert _lr(out) == 1e-4  # config.yaml left as it was

    # what may change freely: the step budget
    longer = _run(*common, "total_train_steps=3")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert not (out / "config.yaml").read_text().startswith("#")

    allowed = _run(
        *common, "total_train_steps=4", "actor.optimizer.lr=2e-4", "recover.allow_changed_keys=true"
    )
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    text = (out / "config.yaml").read_text()
    assert text.startswith(
        "# resumed with changed training keys (checkpoint -> this run): "
        "actor.optimizer.lr 0.0001 -> 0.0002\n"
    )
    assert _lr(out) == 2e-4
    steps = [m["step"] for m in read_metrics(out) if "actor/loss" in m]
    assert steps == [1, 2, 3, 4]


def test_a_failed_save_is_one_line_and_keeps_the_metrics(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("a file where the saves go")  # every save fails
    proc = _run(f"output_dir={out}", "total_train_steps=2", "saver.freq_steps=1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = _error_lines(proc)
    assert line.startswith(f"error: saver: a save into {out} failed (")
    assert line.endswith("; metrics.jsonl and the checkpoints written before are kept")
    # the step whose save failed still has its metrics line
    assert [m["step"] for m in read_metrics(out) if "actor/loss" in m] == [1]


def test_a_resume_past_total_train_steps_is_refused(tmp_path: Path) -> None:
    """Found in the new-user sweep: a run at step 2 rerun with ``total_train_steps=1`` resumed,
    trained nothing, saved step 2's policy as ``checkpoints/final`` and exited 0."""
    out = tmp_path / "run"
    recover = ("recover.mode=auto", "recover.freq_steps=1", "evaluator.eval_at_end=false")
    first = _run(f"output_dir={out}", "total_train_steps=2", "saver.save_at_end=false", *recover)
    assert first.returncode == 0, first.stderr[-3000:]
    again = _run(f"output_dir={out}", "total_train_steps=1", *recover)
    assert again.returncode == 2, again.stderr[-3000:]
    assert again.stderr.strip().splitlines() == [
        f"error: recover.mode: recover checkpoint {out / 'recover' / 'step_2'} is at step 2, "
        "past total_train_steps=1: resuming would train nothing; set total_train_steps above 2 "
        "to continue that run; overwrite_output_dir=true replaces that run, or choose another "
        "output_dir"
    ]
    assert not (out / "checkpoints" / "final").exists()
    same = _run(f"output_dir={out}", "total_train_steps=2", "saver.save_at_end=false", *recover)
    assert same.returncode == 0, same.stderr[-3000:]  # at total_train_steps: a finished run
