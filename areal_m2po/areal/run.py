"""Run an AReaL script unchanged: ``python -m areal_m2po.areal.run SCRIPT [ARGS...]``.

SCRIPT runs as ``__main__`` with ``sys.argv = [SCRIPT, *ARGS]``, as ``python3 SCRIPT ARGS``
would run it, with two differences for this process only:

- ``import areal`` and ``import areal.X`` give this package's AReaL wing
  (``areal_m2po.areal`` and ``areal_m2po.areal.X``, the same module objects), through an
  import finder placed first; an installed AReaL is not touched (nor is any ``areal``
  installed here), and a child process imports as usual;
- the current folder is on the import path after SCRIPT's own folder, so a script run from
  AReaL's repository root imports ``examples.*`` as it does there.

An AReaL name the wing does not have fails at its import with Python's own error naming it; a
bad config key (``load_expr_config``) is one ``error:`` line with exit status 2, as
``python -m areal_m2po.train`` reports it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["ArealAliasFinder", "main", "run_script"]

_PREFIX = "areal_m2po."


class ArealAliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``areal`` and ``areal.*`` as the wing's modules of the same path."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "areal" and not fullname.startswith("areal."):
            return None
        try:
            found = importlib.util.find_spec(_PREFIX + fullname)
        except ModuleNotFoundError:
            found = None
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, self, is_package=found.submodule_search_locations is not None
        )

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(_PREFIX + spec.name)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the wing's module ran when it was imported under its own name."""


def run_script(script: str, args: Sequence[str]) -> None:
    """Run ``script`` as ``__main__`` with ``args`` (see the module doc).

    Raises:
        FileNotFoundError: ``script`` is not a file.
    """
    if not os.path.isfile(script):
        raise FileNotFoundError(f"areal_m2po.areal.run: no script {script!r}")
    if not any(isinstance(f, ArealAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, ArealAliasFinder())
    here = os.getcwd()
    script_dir = os.path.dirname(os.path.abspath(script))
    sys.path[:] = [script_dir, here] + [p for p in sys.path if p not in ("", here, script_dir)]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: python -m areal_m2po.areal.run SCRIPT [ARGS...]", file=sys.stderr)
        return 0 if args else 2
    from areal_m2po.api.errors import ConfigError
    from areal_m2po.utils.console import print_error

    try:
        run_script(args[0], args[1:])
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:  # a bad key in the script's config: one line, as the CLI says it
        print_error(exc)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
