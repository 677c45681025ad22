"""AReaL's ``areal.utils.dynamic_import.import_from_string`` (areal-project/AReaL cbff54d6)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_from_string"]


def import_from_string(module_path: str) -> Any:
    """The object ``"package.module.Name"`` names (split at the last dot).

    Raises:
        ValueError: not a non-empty string with a dot.
        ImportError: the module does not import.
        AttributeError: the module has no such name.
    """
    if not module_path or not isinstance(module_path, str):
        raise ValueError(
            f"Invalid module path: {module_path!r}. "
            "Expected a non-empty string like 'module.path.ObjectName'."
        )
    module_name, dot, name = module_path.rpartition(".")
    if not dot:
        raise ValueError(
            f"Invalid module path: {module_path!r}. "
            "Expected format 'module.path.ObjectName', got 1 part(s)."
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"Failed to import module '{module_name}' from path '{module_path}': {exc}"
        ) from exc
    if not hasattr(module, name):
        raise AttributeError(f"Module '{module_name}' has no attribute '{name}'.")
    return getattr(module, name)
