"""areal_m2po/algo holds the pure maths: every import in every file of it (module level, inside
functions, under TYPE_CHECKING alike) is the standard library, torch or areal_m2po.algo itself,
never areal_m2po.api or areal_m2po.utils. Read from the source with ast, nothing imported."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ALGO = Path(__file__).resolve().parents[2] / "areal_m2po" / "algo"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted module)`` of every import in ``path``; ``from X import a`` gives ``X.a``
    (``a`` may be a module), relative imports are resolved against the algo package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: inside areal_m2po.algo
                parent = ["areal_m2po", "algo"][: 3 - node.level]
                base = ".".join(parent + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def allowed(module: str) -> bool:
    top = module.split(".")[0]
    if top == "areal_m2po":
        return module.startswith("areal_m2po.algo.")
    return top == "torch" or top in sys.stdlib_module_names or top == "__future__"


def test_algo_imports_only_torch_the_standard_library_and_itself() -> None:
    files = sorted(ALGO.glob("*.py"))
    assert len(files) > 10, files  # the package is where the test thinks it is
    bad = [
        f"{path.name}:{line}: {module}"
        for path in files
        for line, module in imported_modules(path)
        if not allowed(module)
    ]
    assert not bad, bad


def test_the_check_sees_an_api_or_utils_import(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\nfrom areal_m2po.algo import checks\n"
        "def f():\n    from areal_m2po.api.cli_args import PPOConfig\n"
        "from areal_m2po import utils\nfrom ..utils import dist\nimport numpy\n",
        encoding="utf-8",
    )
    bad = sorted(m for _, m in imported_modules(sample) if not allowed(m))
    assert bad == [
        "areal_m2po.api.cli_args.PPOConfig",
        "areal_m2po.utils",
        "areal_m2po.utils.dist",
        "numpy",
    ]
