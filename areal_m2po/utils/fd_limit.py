"""The open-file limit of a process that serves HTTP (the trainer hosts the agent endpoint;
the rollout servers): raised from the soft to the hard limit at start, so connections cannot
use up the usual 1,024 descriptors that log files, checkpoints and datasets need too."""

from __future__ import annotations

import contextlib

__all__ = ["raise_open_file_limit"]


def raise_open_file_limit() -> tuple[int, int] | None:
    """Raise ``RLIMIT_NOFILE``'s soft limit to its hard limit; returns ``(soft, hard)`` after,
    or None where the platform has no such limit. Never raises."""
    try:
        import resource
    except ImportError:  # not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)
