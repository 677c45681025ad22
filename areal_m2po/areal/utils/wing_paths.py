"""AReaL's dotted paths read as this wing's: ``areal.X`` names ``areal_m2po.areal.X`` (a
workflow, reward or filter a script names by AReaL's path), with or without the runner
(:mod:`areal_m2po.areal.run`)."""

from __future__ import annotations

from typing import Any

from areal_m2po.areal.utils.dynamic_import import import_from_string

__all__ = ["areal_path", "import_areal"]


def areal_path(path: str) -> str:
    """``path`` with an ``areal.`` prefix read as this wing's (``areal_m2po.areal.``)."""
    return "areal_m2po." + path if path == "areal" or path.startswith("areal.") else path


def import_areal(path: str) -> Any:
    """The object ``"package.module.Name"`` names, AReaL's paths read as the wing's (errors
    as :func:`~areal_m2po.areal.utils.dynamic_import.import_from_string`'s)."""
    return import_from_string(areal_path(path))
