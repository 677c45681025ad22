"""The watchdog of a server the trainer started: act as soon as the trainer is gone.

The trainer passes its pid (``--parent-pid``); each server watches it in a daemon thread, so
no server outlives a trainer killed by SIGKILL (the process manager's own stop covers every
other exit).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

__all__ = ["watch_parent"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def watch_parent(parent_pid: int, on_gone: Callable[[], None], interval_s: float = 0.5) -> None:
    """Call ``on_gone()`` (in a daemon thread) once ``parent_pid`` has exited or is no longer
    this process's parent."""

    def run() -> None:
        while _alive(parent_pid) and os.getppid() == parent_pid:
            time.sleep(interval_s)
        on_gone()

    threading.Thread(target=run, name="parent-watchdog", daemon=True).start()
