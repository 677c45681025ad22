"""The rollout package's import direction (issue 45): servers may use engines, engines never
use servers, and what both need (:mod:`areal_m2po.rollout.common`) imports neither. Read from
the source with :mod:`ast`, so an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import areal_m2po

ROLLOUT = Path(areal_m2po.__file__).parent / "rollout"


def _imports(folder: str) -> list[tuple[str, str]]:
    """(file, imported module) of every ``import``/``from`` statement under ``folder``."""
    found = []
    for path in sorted((ROLLOUT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append((path.name, node.module))
            elif isinstance(node, ast.Import):
                found.extend((path.name, alias.name) for alias in node.names)
    return found


def test_engines_never_import_servers():
    upward = [(f, m) for f, m in _imports("engines") if m.startswith("areal_m2po.rollout.servers")]
    assert upward == []


def test_common_imports_neither_engines_nor_servers():
    banned = ("areal_m2po.rollout.engines", "areal_m2po.rollout.servers")
    assert [(f, m) for f, m in _imports("common") if m.startswith(banned)] == []
    assert _imports("common"), "the package is read"


def test_the_stable_entry_points_still_import():
    from areal_m2po.rollout.vllm_worker_ext import WeightReloadExtension
    from areal_m2po.rollout_server import main

    assert callable(main) and WeightReloadExtension.__name__ == "WeightReloadExtension"
