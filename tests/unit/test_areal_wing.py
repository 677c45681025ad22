"""The AReaL wing is one place: every module outside ``areal_m2po/areal/`` and the config
readers of ``areal_m2po/api/areal/`` leaves the wing alone (only the config loader reads AReaL
files through those readers), and where AReaL and this package name the same option there is
one default."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from areal_m2po.api.cli_args import NormConfig, RejectionSamplingConfig
from areal_m2po.api.config_loader import load_config

PACKAGE = Path(__file__).resolve().parents[2] / "areal_m2po"

WING = "areal_m2po.areal"
READERS = "areal_m2po.api.areal"
READER_USERS = {"areal_m2po.api.config_loader"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports (relative imports resolved; ``from X import y`` gives
    ``X`` and ``X.y``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def wing_violations(root: Path) -> list[str]:
    """``module: imported`` for each import of the wing from outside it (and of the config
    readers from anywhere but the config loader), under the package folder ``root``."""
    problems = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        if _under(module, WING):
            continue
        reader_ok = _under(module, READERS) or module in READER_USERS
        for name in sorted(_imports(path, module)):
            if _under(name, WING) or (_under(name, READERS) and not reader_ok):
                problems.append(f"{module}: {name}")
    return problems


def test_no_module_outside_the_wing_imports_it() -> None:
    assert wing_violations(PACKAGE) == []


def test_the_scan_finds_an_import_of_the_wing(tmp_path: Path) -> None:
    pkg = tmp_path / "areal_m2po"
    (pkg / "areal" / "utils").mkdir(parents=True)
    (pkg / "api" / "areal").mkdir(parents=True)
    (pkg / "trainer").mkdir()
    for folder in (pkg, pkg / "areal", pkg / "areal" / "utils", pkg / "api", pkg / "api" / "areal"):
        (folder / "__init__.py").write_text("")
    (pkg / "areal" / "utils" / "data.py").write_text("from areal_m2po.algo import kl\n")
    (pkg / "api" / "config_loader.py").write_text("from areal_m2po.api.areal import config\n")
    (pkg / "trainer" / "__init__.py").write_text("")
    (pkg / "trainer" / "plain.py").write_text("import torch\n")
    assert wing_violations(pkg) == []
    (pkg / "trainer" / "actor.py").write_text("from areal_m2po.areal.utils import data\n")
    (pkg / "trainer" / "rel.py").write_text("from ..areal.utils.data import x\n")
    (pkg / "trainer" / "cfg.py").write_text("import areal_m2po.api.areal.config\n")
    assert wing_violations(pkg) == [
        "areal_m2po.trainer.actor: areal_m2po.areal.utils",
        "areal_m2po.trainer.actor: areal_m2po.areal.utils.data",
        "areal_m2po.trainer.cfg: areal_m2po.api.areal.config",
        "areal_m2po.trainer.rel: areal_m2po.areal.utils.data",
        "areal_m2po.trainer.rel: areal_m2po.areal.utils.data.x",
    ]


def test_rejection_sampling_upper_has_one_default() -> None:
    """AReaL's default (5.0, areal/api/cli_args.py at cbff54d6) for the trainer's section, the
    AReaL class and an AReaL file's section alike."""
    from areal_m2po.areal.api.cli_args import RejectionSamplingConfig as ArealRS

    assert RejectionSamplingConfig().upper == ArealRS().upper == 5.0
    cfg = load_config(["actor.rejection_sampling.level=token"])
    assert cfg.actor.rejection_sampling.upper == 5.0


def test_an_areal_file_s_norm_section_takes_areals_defaults(tmp_path: Path) -> None:
    """An AReaL file's ``adv_norm`` that leaves out the levels gets AReaL's (batch, batch,
    group_size 1), the defaults of AReaL's NormConfig here too; a trainer file its own."""
    from areal_m2po.areal.api.cli_args import NormConfig as ArealNorm

    path = tmp_path / "areal.yaml"
    path.write_text("cluster: {n_nodes: 1}\nactor:\n  adv_norm:\n    std_unbiased: false\n")
    norm = load_config(["--config", str(path), "actor.path=builtin:tiny"]).actor.adv_norm
    areal = ArealNorm()
    assert (norm.mean_level, norm.std_level, norm.group_size) == ("batch", "batch", 1)
    assert (areal.mean_level, areal.std_level, areal.group_size) == ("batch", "batch", 1)
    assert norm.std_unbiased is False
    plain = tmp_path / "plain.yaml"
    plain.write_text("actor:\n  adv_norm:\n    std_unbiased: false\n")
    own = load_config(["--config", str(plain)]).actor.adv_norm
    assert (own.mean_level, own.std_level) == (NormConfig().mean_level, NormConfig().std_level)


@pytest.mark.parametrize(
    "name", ["NormConfig", "RejectionSamplingConfig", "MicroBatchSpec", "PPOActorConfig"]
)
def test_areal_s_config_classes_are_the_trainer_s(name: str) -> None:
    """One class per concept: AReaL's argument objects are the trainer's classes (adapters
    that subclass them where AReaL differs)."""
    from areal_m2po.api import cli_args
    from areal_m2po.areal.api import cli_args as areal_cli_args

    trainer_name = {"PPOActorConfig": "ActorConfig", "MicroBatchSpec": "MicroBatchSplit"}
    assert issubclass(
        getattr(areal_cli_args, name), getattr(cli_args, trainer_name.get(name, name))
    )
