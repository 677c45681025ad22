"""The one-line errors of a rollout workflow or agent that fails: which ``rollout.workflow``,
what it raised, and where in the user's code (file and line)."""

from __future__ import annotations

import logging
import os
import sysconfig
import traceback

from areal_m2po.api.errors import WorkflowError

__all__ = ["episode_failure", "raise_site"]

logger = logging.getLogger(__name__)

_LIBRARY_DIRS = tuple(
    os.path.join(os.path.realpath(d), "")
    for d in {
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # this package
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["purelib"],
        sysconfig.get_paths()["platlib"],
    }
)


def raise_site(exc: BaseException) -> str | None:
    """``file:line`` where ``exc`` (or the exception at the root of its ``raise ... from``
    chain) was raised: the innermost frame outside this package, the standard library and
    installed packages, i.e. in the user's workflow or agent; None when there is none."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    frames = traceback.extract_tb(root.__traceback__)
    user = [f for f in frames if not os.path.realpath(f.filename).startswith(_LIBRARY_DIRS)]
    if not user:
        return None
    return f"{user[-1].filename}:{user[-1].lineno}"


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (`` ...`` marks a message cut after its first line),
    with `` (at file:line)`` of :func:`raise_site` where there is one."""
    lines = str(exc).strip().splitlines() or [""]
    text = lines[0] + (" ..." if len(lines) > 1 else "")
    site = raise_site(exc)
    return f"{type(exc).__name__}: {text}" + (f" (at {site})" if site else "")


def episode_failure(
    workflow_name: str, exc: BaseException, what: str = "an episode"
) -> BaseException:
    """The one-line error of a workflow episode that raised ``exc``, naming
    ``rollout.workflow``; an error of this package (a server that died, a
    :class:`WorkflowError`) is returned as it is. The full traceback goes to the log at DEBUG
    level."""
    if type(exc).__module__.startswith("areal_m2po."):  # the package's own errors (a dead
        return exc  # server, a workflow's contract) say what happened themselves
    logger.debug("%s of rollout.workflow %s raised", what, workflow_name, exc_info=exc)
    return WorkflowError(f"rollout.workflow {workflow_name}: {what} raised {one_line(exc)}")
