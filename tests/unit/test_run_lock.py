"""The output folder's run lock (:mod:`areal_m2po.utils.run_lock`): a second run into a folder
in use stops in one line naming the first (host, pid); a lock left by a dead process is taken
over with a note; releasing leaves no file behind."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from areal_m2po.api.errors import RunError
from areal_m2po.utils.run_lock import LOCK_NAME, RunFolderBusy, RunFolderUnwritable, RunLock

HOLD = textwrap.dedent(
    """
    import sys, time
    from areal_m2po.utils.run_lock import RunLock
    lock = RunLock(sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    time.sleep(120)
    """
)


def test_a_lock_names_its_holder_and_an_earlier_run_of_this_process_is_no_obstacle(tmp_path):
    out = tmp_path / "run"
    first = RunLock(str(out))
    first.acquire()
    holder = json.loads((out / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    # a trainer of this process that failed to build never released it: the next run of the
    # same process goes on (the process holds the flock)
    second = RunLock(str(out))
    second.acquire()
    assert second.held
    second.release()
    first.release()
    assert not out.exists()  # the run left the folder empty: it is gone with the lock
    with RunLock(str(out)) as again:
        assert again.held
    assert not out.exists()


def test_release_keeps_a_folder_the_run_wrote_into(tmp_path):
    out = tmp_path / "run"
    with RunLock(str(out)):
        (out / "metrics.jsonl").write_text("{}\n")
    assert sorted(os.listdir(out)) == ["metrics.jsonl"]


def test_a_lock_of_another_live_process_names_it_and_a_dead_ones_is_taken_over(tmp_path, caplog):
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusy) as caught:
            RunLock(str(out)).acquire()
        message = str(caught.value)
        assert isinstance(caught.value, RunError) and "\n" not in message
        assert message.startswith(f"output_dir: {out} is in use by the run of pid {proc.pid} on ")
        assert message.endswith("wait for that run to end, or choose another output_dir")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert (out / LOCK_NAME).exists()  # killed: the file stays, its flock is gone
    caplog.set_level(logging.WARNING, logger="areal_m2po.trainer")
    lock = RunLock(str(out))
    lock.acquire()
    assert f"took over the lock of the run of pid {proc.pid} on" in caplog.text
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()


def test_a_folder_that_cannot_be_written_is_named_in_one_line(tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(RunFolderUnwritable) as caught:
        RunLock(str(tmp_path / "a_file" / "run")).acquire()
    assert str(caught.value) == (
        f"output_dir: cannot write into {tmp_path / 'a_file' / 'run'} (Not a directory); "
        "choose another output_dir"
    )
    with pytest.raises(RunFolderUnwritable, match=r"a_file is a file, not a folder; choose"):
        RunLock(str(tmp_path / "a_file")).acquire()
    if os.geteuid() != 0:  # root writes into read-only folders
        (tmp_path / "ro").mkdir(mode=0o500)
        with pytest.raises(RunFolderUnwritable, match="Permission denied"):
            RunLock(str(tmp_path / "ro" / "run")).acquire()
