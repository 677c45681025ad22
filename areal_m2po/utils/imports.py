"""Load a user-supplied object named by a dotted path in the config (reward function, ...).

Every config key whose value is ``"package.module:attribute"`` (or
``"package.module.attribute"``) goes through :func:`load_object`, so a broken user module
always ends the same way: one :class:`~areal_m2po.api.errors.ConfigError` line naming the
config key, the module, and where it failed (file and line), which ``python -m
areal_m2po.train`` prints as ``error: <key>: ...`` with exit status 2 before any model loads.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import os
import traceback
from types import ModuleType, TracebackType
from typing import Any

from areal_m2po.api.errors import ConfigError

__all__ = ["load_object", "split_spec"]

_IMPORT_MACHINERY = ("<frozen importlib", os.path.dirname(importlib.__file__) + os.sep)


def split_spec(spec: str, key: str) -> tuple[str, str]:
    """``(module, attribute path)`` of ``"module:attr"`` or ``"module.attr"``.

    Raises:
        ConfigError: ``key`` is empty or not of either form.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(key, f"{spec!r} is empty; expected 'package.module:function'")
    spec = spec.strip()
    if ":" in spec:
        module_name, _, attr_path = spec.partition(":")
    else:
        module_name, _, attr_path = spec.rpartition(".")
    if not module_name or not attr_path:
        raise ConfigError(key, f"{spec!r} is malformed; expected 'package.module:function'")
    return module_name, attr_path


def _user_frame(tb: TracebackType | None) -> tuple[str, int] | None:
    """``(file, line)`` where an import failed: the innermost module-level statement that ran.

    Module-level code is what an import executes, so the innermost ``<module>`` frame outside
    importlib is the user's statement that raised (or that called the code that raised);
    without one, the innermost frame outside importlib.
    """
    frames = traceback.extract_tb(tb)[1:]  # [0]: the caller's own import_module call
    frames = [f for f in frames if not f.filename.startswith(_IMPORT_MACHINERY)]
    if not frames:
        return None
    module_level = [f for f in frames if f.name == "<module>"]
    frame = (module_level or frames)[-1]
    return frame.filename, frame.lineno or 0


def _path_hint(spec: str) -> str:
    """Advice when ``spec`` names a file (``dir/file.py:fn``) rather than a module."""
    module_name, _, attr = spec.partition(":")
    if not (module_name.endswith(".py") or os.sep in module_name or "/" in module_name):
        return ""
    path = os.path.expanduser(module_name)
    if not os.path.isfile(path):
        return f"; it is read as a module path, and no file {path} exists either"
    folder, stem = os.path.split(os.path.abspath(path))
    stem = stem[:-3] if stem.endswith(".py") else stem
    return (
        f"; a file path is not a module: put {folder} on PYTHONPATH and write "
        f"'{stem}:{attr or 'function'}'"
    )


def _import(module_name: str, spec: str, key: str) -> ModuleType:
    """``importlib.import_module`` with every failure turned into one ConfigError line."""
    try:
        return importlib.import_module(module_name)
    except SyntaxError as exc:  # the user's file does not parse: the error carries file:line
        where = f"{exc.filename}:{exc.lineno}"
        what = f"{type(exc).__name__}: {exc.msg}"
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - any failure of the user's code
        found = _user_frame(exc.__traceback__)
        if found is None and isinstance(exc, ModuleNotFoundError):  # the module itself is missing
            raise ConfigError(
                key, f"{spec!r}: cannot import module {module_name!r} ({exc}){_path_hint(spec)}"
            ) from None
        where = f"{found[0]}:{found[1]}" if found else "<unknown file>"
        what = f"{type(exc).__name__}: {exc}"
    raise ConfigError(key, f"{spec!r}: cannot import module {module_name!r}: {where}: {what}")


def _definition_line(path: str | None, name: str) -> int | None:
    """The line of the last top-level statement that binds ``name`` in the file ``path``."""
    if not path or not path.endswith(".py"):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    line = None
    for node in tree.body:
        bound: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [(a.asname or a.name).split(".")[0] for a in node.names]
        if name in bound:
            line = node.lineno
    return line


def load_object(spec: str, key: str, *, callable_required: bool = True) -> Any:
    """Import the object ``spec`` (``"module:attr.sub"`` or ``"module.attr"``) names.

    Args:
        spec: the dotted path, as written in the config.
        key: the config key that holds it (``reward.path``); every error names it.
        callable_required: refuse an object that is not callable.

    Raises:
        ConfigError: one line naming ``key`` and ``spec`` when ``spec`` is malformed, the module
            is missing or fails to import (a syntax error, any exception raised while it runs:
            the file and line are named), the attribute is missing (the module's file is
            named, with the nearest existing name), or it is not callable (file and line of
            its definition when found).
    """
    module_name, attr_path = split_spec(spec, key)
    spec = spec.strip()
    target: Any = _import(module_name, spec, key)
    module_file = getattr(target, "__file__", None) or "<no file>"
    for part in attr_path.split("."):
        if not hasattr(target, part):
            names = [n for n in dir(target) if not n.startswith("__")]
            near = difflib.get_close_matches(part, names, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise ConfigError(
                key,
                f"{spec!r}: module {module_name!r} ({module_file}) has no attribute "
                f"{attr_path!r}{hint}",
            )
        target = getattr(target, part)
    if callable_required and not callable(target):
        line = _definition_line(module_file, attr_path) if "." not in attr_path else None
        where = f"{module_file}:{line}" if line else module_file
        raise ConfigError(
            key,
            f"{spec!r}: {attr_path!r} in module {module_name!r} ({where}) is not callable "
            f"(type {type(target).__name__})",
        )
    return target
