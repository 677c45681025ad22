"""Which of a user's vLLM server arguments the servers started here refuse.

vLLM's parser reads ``--api_key`` as ``--api-key`` (underscores become dashes) and, like any
``argparse`` parser, takes an unambiguous prefix (``--api-k``, ``--hos``) for the whole flag;
``--config FILE.yaml`` reads further flags from a file. So a guarded flag is refused in every
spelling that could reach it, not only its exact name: the key would land on vLLM's command
line (which ``ps`` shows and vLLM logs) or the server would bind a public address without
``rollout.allow_public_host``. Only the standard library is imported.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["GUARDED_FLAGS", "refused_server_arg"]

GUARDED_FLAGS = {
    "--api-key": "the servers started here take the run's key (rollout.server_api_key)",
    "--host": "write it exactly --host (its address is checked against allow_public_host)",
    "--config": "a config file could set any flag unchecked; give the flags themselves",
}
"""The flags no spelling but the exact one (``--host``) or none at all may reach."""


def refused_server_arg(args: Sequence[str]) -> str | None:
    """One line naming the first argument of ``args`` that spells a guarded flag other than
    exactly (or, for ``--api-key`` and ``--config``, at all), or None."""
    for arg in args:
        if not arg.startswith("--") or arg == "--":
            continue
        name = arg.split("=", 1)[0]
        spelled = name.replace("_", "-").lower()
        for flag, why in GUARDED_FLAGS.items():
            exact_ok = flag == "--host" and name == "--host"
            if exact_ok:
                break
            if spelled == flag or (len(spelled) > 2 and flag.startswith(spelled)):
                return f"{name}: reaches vLLM's {flag}, which is refused here ({why})"
    return None
