"""What the entry points print: the package's log format and the one-line ``error:`` message."""

from __future__ import annotations

import logging
import sys


def setup_logging(is_main: bool) -> None:
    """Log ``areal_m2po.*`` to stderr as ``HH:MM:SS name: message``; INFO on the main process,
    WARNING on the others. Adds the handler once per process (later calls only set the level)."""
    root = logging.getLogger("areal_m2po")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(logging.INFO if is_main else logging.WARNING)
    root.propagate = False


def print_error(message: object) -> None:
    """Print ``error: <message>`` on stderr as one line (whitespace and newlines folded)."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr)
