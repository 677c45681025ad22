"""AReaL's ``areal.utils.logging.getLogger`` (areal-project/AReaL cbff54d6): a standard
:mod:`logging` logger by name. AReaL's also installs its own handlers and formats; here the
trainer's logging set-up applies (``type_`` is accepted and ignored)."""

from __future__ import annotations

import logging

__all__ = ["getLogger"]


def getLogger(name: str | None = None, type_: str | None = None, level: int | None = None):  # noqa: N802 - AReaL's name
    """``logging.getLogger(name or "plain")``, its level set when ``level`` is given."""
    logger = logging.getLogger(name or "plain")
    if level is not None:
        logger.setLevel(level)
    return logger
