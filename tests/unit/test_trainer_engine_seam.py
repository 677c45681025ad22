"""The trainers hand the policy's weights to the rollout side through the engine's methods
(``weights_for_rollout``, ``computes_like_plain_model``, ...): no module under
``areal_m2po/trainer`` reads a train engine's placement, adapter, precision or raw weights."""

from __future__ import annotations

import ast
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "areal_m2po" / "trainer"

INTERNALS = {
    "precision",
    "sharded",
    "lora",
    "adapter",
    "unwrapped",
    "model",
    "state_dict_for_sync",
    "full_tensors",
    "full_tensors_raw",
    "build_full_model",
}
"""What a trainer must not read of an engine: the engine decides from them itself. (Not
``backend``: the trainers' engine *sections* have a ``backend`` key, read before any engine
exists.)"""


def _receiver_name(node: ast.expr) -> str | None:
    """The last name of an attribute's receiver: ``engine`` for ``self.critic.engine``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def engine_internals_read(source: str) -> list[tuple[int, str]]:
    """``(line, "receiver.attribute")`` of every read of :data:`INTERNALS` on an object whose
    name ends with ``engine`` (``engine``, ``self.actor_engine``, ``self.critic.engine``),
    as an attribute or through ``getattr(engine, "name")``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            name = _receiver_name(node.value)
            if name is not None and name.endswith("engine"):
                found.append((node.lineno, f"{name}.{node.attr}"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            args = node.args
            if len(args) >= 2 and isinstance(args[1], ast.Constant):
                name = _receiver_name(args[0])
                if name is not None and name.endswith("engine") and args[1].value in INTERNALS:
                    found.append((node.lineno, f"{name}.{args[1].value}"))
    return found


def test_the_scan_finds_what_the_trainers_used_to_read():
    old = (
        "copy = engine.sharded or engine.lora or engine.precision.enabled\n"
        "m = engine.build_full_model() if copy else engine.unwrapped\n"
        "x = self.actor_engine.state_dict_for_sync().items()\n"
        "y = getattr(self.critic.engine, 'precision')\n"
        "z = self.engine.model.eval()\n"
    )
    want = [
        "actor_engine.state_dict_for_sync",
        "engine.build_full_model",
        "engine.lora",
        "engine.model",
        "engine.precision",
        "engine.precision",
        "engine.sharded",
        "engine.unwrapped",
    ]
    assert sorted(what for _, what in engine_internals_read(old)) == want
    fine = "w = engine.weights_for_rollout()\nv = cfg.model.lora\nself.engine.version += 1\n"
    assert engine_internals_read(fine) == []


def test_no_trainer_reads_an_engines_internals():
    files = sorted(TRAINER.rglob("*.py"))
    assert len(files) > 10
    found = {
        f"{path.relative_to(TRAINER)}:{line}: {what}"
        for path in files
        for line, what in engine_internals_read(path.read_text(encoding="utf-8"))
    }
    assert not found, "trainers read engine internals (use the engine's methods):\n" + "\n".join(
        sorted(found)
    )
