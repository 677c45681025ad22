"""The trainer raises its open-file soft limit to the hard one at start (issue 46: the agent
endpoint lives in the trainer, and its connections used up the usual 1,024 descriptors until
``metrics.jsonl`` could not be opened). Checked through the real entry point in a child whose
soft limit starts at 256."""

from __future__ import annotations

import subprocess
import sys

CHILD = """
import contextlib, io, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
from areal_m2po.train import main
with contextlib.redirect_stdout(io.StringIO()):
    status = main(["--help"])
print(status, *resource.getrlimit(resource.RLIMIT_NOFILE), hard)
"""


def test_the_trainer_entry_point_raises_the_soft_file_limit_to_the_hard_one():
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    status, soft, hard, original_hard = map(int, done.stdout.split()[-4:])
    assert status == 0 and soft == hard == original_hard


def test_raising_is_idempotent_and_never_lowers():
    from areal_m2po.utils.fd_limit import raise_open_file_limit

    first = raise_open_file_limit()
    assert first is not None and first[0] == first[1]
    assert raise_open_file_limit() == first
