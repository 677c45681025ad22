"""User code named by a dotted path in the config (``reward.path``) that fails to load.

Every failure class must end ``python -m areal_m2po.train`` with exit status 2 and exactly one
stderr line ``error: reward.path: ...`` naming the module and the file (and the line, where
the failure has one), before any model loads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.utils.imports import load_object

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")

# name: ({relative file: source}, spec, (file, line or None), fragment of the message)
CASES = {
    "syntax_error": (
        {"syn_reward.py": "import math\n\n\ndef reward(p, c, a:\n    return 1.0\n"},
        "syn_reward:reward",
        ("syn_reward.py", 4),
        "SyntaxError",
    ),
    "raises_at_import": (
        {"boom_reward.py": "import math\n\nTABLE = {}\nSCALE = TABLE['scale']\n"},
        "boom_reward:reward",
        ("boom_reward.py", 4),
        "KeyError: 'scale'",
    ),
    "raises_in_submodule_helper": (
        {
            "rpkg/__init__.py": "",
            "rpkg/rules.py": (
                "def _load():\n    raise RuntimeError('rules file missing')\n\n\n"
                "RULES = _load()\n\n\ndef reward(p, c, a):\n    return 1.0\n"
            ),
        },
        "rpkg.rules:reward",
        (os.path.join("rpkg", "rules.py"), 5),
        "RuntimeError: rules file missing",
    ),
    "missing_dependency": (
        {"dep_reward.py": '"""Needs a package that is not installed."""\n\nimport no_such_pkg_q\n'},
        "dep_reward:reward",
        ("dep_reward.py", 3),
        "No module named 'no_such_pkg_q'",
    ),
    "exits_at_import": (
        {"exit_reward.py": "import sys\n\nsys.exit('configure me first')\n"},
        "exit_reward:reward",
        ("exit_reward.py", 3),
        "SystemExit: configure me first",
    ),
    "missing_attribute": (
        {"ok_reward.py": "def reward(p, c, a):\n    return 1.0\n"},
        "ok_reward:rewards",
        ("ok_reward.py", None),
        "has no attribute 'rewards' (did you mean 'reward'?)",
    ),
    "not_callable": (
        {"const_reward.py": "import math\n\nreward = math.pi\n"},
        "const_reward:reward",
        ("const_reward.py", 3),
        "not callable (type float)",
    ),
}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _where(root: Path, file_line: tuple[str, int | None]) -> str:
    rel, line = file_line
    return str(root / rel) + (f":{line}" if line is not None else "")


@pytest.mark.parametrize("name", sorted(CASES))
def test_train_reports_one_line_and_exits_2(tmp_path: Path, name: str) -> None:
    files, spec, file_line, fragment = CASES[name]
    user = tmp_path / "user"
    _write(user, files)
    out_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(user)]))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "areal_m2po.train",
            "--config",
            TINY,
            f"output_dir={out_dir}",
            f"reward.path={spec}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert line.startswith(f"error: reward.path: {spec!r}: "), line
    assert repr(spec.partition(":")[0]) in line  # the module
    where = _where(user, file_line)
    assert where in line, line
    if file_line[1] is not None:  # file:line, not the file followed by some other number
        assert f"{where}:" in line or f"{where})" in line, line
    assert fragment in line, line
    # stopped before training: no step was logged, no model was saved
    assert not (out_dir / "metrics.jsonl").exists()
    assert not (out_dir / "checkpoints").exists()


@pytest.mark.parametrize("name", sorted(CASES))
def test_load_object_raises_config_error(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, spec, file_line, fragment = CASES[name]
    _write(tmp_path, files)
    monkeypatch.syspath_prepend(str(tmp_path))
    tops = {Path(rel).parts[0].removesuffix(".py") for rel in files}
    try:
        with pytest.raises(ConfigError) as info:
            load_object(spec, "reward.path")
    finally:  # forget the case's modules, so no later test sees this tmp_path's copies
        for module in [m for m in sys.modules if m.split(".")[0] in tops]:
            del sys.modules[module]
    assert info.value.key == "reward.path"
    message = str(info.value)
    assert "\n" not in message
    assert _where(tmp_path, file_line) in message and fragment in message, message


def test_load_object_missing_module_and_success() -> None:
    with pytest.raises(ConfigError, match=r"cannot import module 'no_pkg_q\.mod' \(No module"):
        load_object("no_pkg_q.mod:fn", "reward.path")
    from areal_m2po.reward.math_reward import math_reward_fn

    assert load_object("areal_m2po.reward.math_reward:math_reward_fn", "k") is math_reward_fn
    assert load_object("areal_m2po.reward.math_reward.math_reward_fn", "k") is math_reward_fn
    assert load_object("areal_m2po.reward.math_reward:__all__", "k", callable_required=False)


def test_a_file_path_in_place_of_a_module_gets_the_fix(tmp_path: Path) -> None:
    """Found in the new-user sweep: ``reward.path=/dir/r.py:f`` ended in "No module named
    '/dir/r'", with no word on what reward.path takes instead."""
    user_file = tmp_path / "my_reward.py"
    user_file.write_text("def f(prompt, completion, answer, **kw):\n    return 1.0\n")
    with pytest.raises(ConfigError) as info:
        load_object(f"{user_file}:f", "reward.path")
    assert str(info.value).endswith(
        f"a file path is not a module: put {tmp_path} on PYTHONPATH and write 'my_reward:f'"
    )
    with pytest.raises(ConfigError) as info:
        load_object(f"{tmp_path}/missing.py:f", "reward.path")
    assert str(info.value).endswith(
        f"it is read as a module path, and no file {tmp_path}/missing.py exists either"
    )
