"""``output_dir`` naming an existing file stops a run in one line before any model loads (it
used to end in a FileExistsError traceback from the run-config writer, after the models
loaded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from procs import REPO, subprocess_env, tiny_train_args


def test_output_dir_naming_a_file_is_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "results.txt"
    afile.write_text("not a folder\n")
    proc = subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", *tiny_train_args(afile, 1)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == (
        f"error: output_dir: {afile} is a file; output_dir names the run's folder"
    )
    assert afile.read_text() == "not a folder\n"
