"""No test module imports another: a test module that imports one runs the other's module-level
code (and fixtures, and collected tests in the importer's namespace), so whether it passes
can depend on which ran first. Shared helpers live in ``tests/support/`` (on pytest's
pythonpath)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _test_modules(root: Path) -> dict[str, Path]:
    """Every test module under ``root`` (``test_*.py``), by its module name and by its dotted
    path from the repository root (``tests.integration.test_trainer``)."""
    found: dict[str, Path] = {}
    for path in root.rglob("test_*.py"):
        found[path.stem] = path
        dotted = path.relative_to(root.parent).with_suffix("")
        found[".".join(dotted.parts)] = path
    return found


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, module)`` for each module an ``import`` or ``from`` statement names, with
    ``from a import b`` also giving ``a.b`` (``b`` may be a module)."""
    names: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append((node.lineno, node.module))
            names += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return names


def cross_imports(root: Path) -> list[str]:
    """``file:line imports module`` for each test module under ``root`` that imports another."""
    modules = _test_modules(root)
    found = []
    for path in sorted(set(modules.values())):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, name in _imported_names(tree):
            target = modules.get(name)
            if target is not None and target != path:
                found.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return found


def test_no_test_module_imports_another():
    assert cross_imports(TESTS) == []


def test_the_scan_finds_each_form_of_import(tmp_path: Path):
    root = tmp_path / "tests"
    (root / "unit").mkdir(parents=True)
    (root / "support").mkdir()
    (root / "unit" / "test_a.py").write_text("X = 1\n")
    (root / "unit" / "test_b.py").write_text(
        "import os\nfrom test_a import X\nfrom tests.unit import test_a\n"
        "import tests.unit.test_a\nfrom helpers import Y\n"
    )
    (root / "unit" / "test_c.py").write_text("def f():\n    from test_b import g\n")
    (root / "support" / "helpers.py").write_text("from test_a import X\n")  # not a test module
    assert cross_imports(root) == [
        "tests/unit/test_b.py:2 imports test_a",
        "tests/unit/test_b.py:3 imports tests.unit.test_a",
        "tests/unit/test_b.py:4 imports tests.unit.test_a",
        "tests/unit/test_c.py:2 imports test_b",
    ]
