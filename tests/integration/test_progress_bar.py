"""Every trainer (RL, SFT, reward model) shows the step bar with its headline figures when its
stderr is a terminal (a pseudo-terminal here), and none when it is a pipe; the per-step metrics
line is there either way; no run prints a deprecation notice."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

import pytest
from procs import REPO, subprocess_env, tiny_train_args

pytestmark = pytest.mark.slow


def _pairs(path) -> str:
    rows = [
        {"prompt": f"What is {a} + 1?", "chosen": f"{a + 1} yes", "rejected": f"{a + 1} no"}
        for a in range(16)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _commands(tmp_path) -> dict[str, list[str]]:
    """Two steps of each trainer, with a held-out evaluation at the end."""
    common = ("total_train_steps=2", "num_threads=1", "stats_logger.progress_bar=true")
    rl = tiny_train_args(tmp_path / "rl", 2, "stats_logger.progress_bar=true")
    sft = ["model.path=builtin:tiny", f"output_dir={tmp_path / 'sft'}", *common]
    sft += ["train_dataset.max_samples=8", "train_dataset.batch_size=4"]
    sft += ["valid_dataset.max_samples=8", "saver.save_at_end=false"]
    pairs = _pairs(tmp_path / "pairs.jsonl")
    rm = ["model.path=builtin:tiny", f"output_dir={tmp_path / 'rm'}", *common]
    rm += [f"train_dataset.path={pairs}", "train_dataset.batch_size=4"]
    rm += [f"valid_dataset.path={pairs}", "saver.save_at_end=false"]
    return {
        "areal_m2po.train": rl[:-1] + ["evaluator.eval_at_end=true", rl[-1]],
        "areal_m2po.train_sft": sft,
        "areal_m2po.train_rm": rm,
    }


HEADLINES = {
    "areal_m2po.train": ("reward=", "eval_acc="),
    "areal_m2po.train_sft": ("loss=", "eval_ppl="),
    "areal_m2po.train_rm": ("loss=", "eval_acc="),
}


def _start_on_terminal(module: str, args: list[str]) -> tuple[subprocess.Popen, list[bytes]]:
    """``python -m module *args`` with stderr on a new 200-column pseudo-terminal; what the
    terminal receives is appended to the returned list until the process closes it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=slave,
    )
    os.close(slave)
    received: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            received.append(chunk)
        os.close(master)

    threading.Thread(target=drain, daemon=True).start()
    return proc, received


def test_every_trainer_shows_the_bar_on_a_terminal_only(tmp_path):
    commands = _commands(tmp_path)
    on_terminal = {m: _start_on_terminal(m, args) for m, args in commands.items()}
    piped = subprocess.Popen(
        [sys.executable, "-m", "areal_m2po.train_sft", *commands["areal_m2po.train_sft"]]
        + [f"output_dir={tmp_path / 'sft_piped'}"],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for module, (proc, received) in on_terminal.items():
        assert proc.wait(timeout=300) == 0, module
        proc_out = b"".join(received).decode(errors="replace")
        screens = [s.strip() for s in proc_out.replace("\r", "\n").split("\n") if s.strip()]
        bars = [s for s in screens if s.startswith("train:")]
        assert bars, (module, proc_out[-3000:])
        final = bars[-1]
        assert final.startswith("train: 100%") and "2/2" in final, (module, final)
        assert "<00:00" in final  # elapsed < left
        for label in HEADLINES[module]:
            assert label in final, (module, final)
        # the metrics line of each step is still printed, as a line of its own
        assert any(" step 2 | " in s for s in screens), (module, screens)
        # no library deprecation notice (the RL run generates with a KV cache)
        assert "deprecated" not in proc_out.lower(), (module, proc_out[-3000:])
    _, err = piped.communicate(timeout=300)
    assert piped.returncode == 0, err[-3000:]
    assert "\r" not in err and "train:" not in err and " step 2 | " in err
