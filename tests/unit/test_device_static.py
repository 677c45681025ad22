"""Where fake tensors cannot go, a static check: every tensor the package builds from scratch
(``torch.tensor``, ``torch.zeros``, ``torch.arange``, ...) names its ``device=``, or sits on
:data:`HOST_TENSORS` with the reason it belongs on the host. A new constructor without a device
fails here until it gets one or a reason (tests/unit/fake_algo_cases.py runs the code
fake tensors can run on a fake accelerator)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "areal_m2po"

CONSTRUCTORS = {
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
    "rand", "randn", "randint", "randperm",
}  # fmt: skip

_COMM = "a host scalar for dist.all_reduce_*, which moves it to the process group's device"
_HOST_BATCH = "builds the host batch from Python data; the engine moves micro-batches"
_HOST_IDX = "row indices into the host batch (index_select moves them to each tensor's device)"
_HOST_OUT = "the host copy of per-micro-batch results, gathered with .cpu() by design"
_HOST_STAT = "a host scalar of Python numbers, read once on the host"

_SYNC = "one host sync per step or per batch"

HOST_TENSORS: dict[str, tuple[int, str]] = {
    "trainer/rw_trainer.py": (3, _HOST_BATCH + "; " + _HOST_OUT + "; " + _COMM),
    "trainer/step_loop.py": (2, _COMM + " (the stop votes)"),
    "trainer/rl_trainer.py": (2, _COMM),
    "trainer/sft_trainer.py": (1, _COMM),
    "trainer/ppo/critic.py": (2, _COMM + "; " + _HOST_IDX),
    "trainer/ppo/actor.py": (7, _COMM + " (" + _SYNC + "); " + _HOST_IDX),
    "trainer/rollout_stats.py": (3, _COMM),
    "trainer/dpo_trainer.py": (2, _COMM + "; an empty host result"),
    "rollout/batch_builder.py": (11, _HOST_BATCH),
    "rollout/engines/hf_generator.py": (3, "left-padded host prompts, moved with .to(device)"),
    "rollout/rewards.py": (2, _HOST_STAT + " (rewards of the host batch)"),
    "engine/packing_check.py": (1, _COMM),
    "engine/train_engine.py": (1, _COMM + " (" + _SYNC + ")"),
    "engine/shared_prefix.py": (1, _HOST_IDX),
    "engine/prefix_tree.py": (6, "a prefix layout from host token lists (moved where used)"),
    "engine/precision.py": (1, _COMM),
    "engine/backends/fsdp2.py": (1, _COMM + " (the most micro-batches of any rank)"),
    "engine/packing.py": (13, "a layout from host Python lists (the micro-batch's device follows)"),
    "engine/step_stats.py": (3, _COMM + "; " + _HOST_STAT),
    "reward/reward_model.py": (7, "host batches of token lists and host scores"),
    "utils/data.py": (2, _HOST_IDX),
    "areal/trainer/episodes.py": (2, "AReaL's host tensor dict of a group (dynamic_filter_fn)"),
    "areal/workflow/_episode.py": (7, "AReaL's episode dict: host tensors, as AReaL returns them"),
    "areal/experimental/openai/types.py": (1, "AReaL's interaction dict: host tensors, as AReaL"),
    "dataset/sft.py": (7, _HOST_BATCH),
}
"""File under areal_m2po/ -> (how many constructors without ``device=`` it holds, why they
belong on the host). The batch lives on the host and micro-batches move to the device in
``HFTrainEngine``; what the loss and the model compute follows its inputs' device."""


def _device_less_calls() -> Counter[tuple[str, str]]:
    """(file under the package, enclosing ``Class.function``) -> constructors there without
    ``device=``."""
    found: Counter[tuple[str, str]] = Counter()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        _visit(ast.parse(path.read_text(encoding="utf-8")), rel, [], found)
    return found


def _visit(node: ast.AST, rel: str, scope: list[str], found: Counter[tuple[str, str]]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _visit(child, rel, [*scope, child.name], found)
            continue
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Attribute)
            and child.func.attr in CONSTRUCTORS
            and isinstance(child.func.value, ast.Name)
            and child.func.value.id == "torch"
            and not any(k.arg == "device" for k in child.keywords)
        ):
            found[(rel, ".".join(scope[:2]) or "<module>")] += 1
        _visit(child, rel, scope, found)


def test_every_device_less_constructor_has_a_reason():
    found: Counter[str] = Counter()
    for (rel, _), n in _device_less_calls().items():
        found[rel] += n
    unexplained = {k: n for k, n in found.items() if k not in HOST_TENSORS}
    assert not unexplained, f"tensors built without device= (give one, or a reason): {unexplained}"
    changed = {k: (n, HOST_TENSORS[k][0]) for k, n in found.items() if HOST_TENSORS[k][0] != n}
    assert not changed, f"(found, listed) device-less constructors differ: {changed}"
    stale = sorted(set(HOST_TENSORS) - set(found))
    assert not stale, f"allow-list entries with no device-less constructor left: {stale}"


def test_algo_builds_every_tensor_on_its_inputs_device():
    """``algo/`` takes its device from its inputs: no constructor without ``device=``."""
    algo = {k: n for k, n in _device_less_calls().items() if k[0].startswith("algo/")}
    assert algo == {}


def test_the_check_sees_a_planted_device_less_tensor(tmp_path, monkeypatch):
    """A constructor without ``device=`` in a new function is caught, one with it is not."""
    pkg = tmp_path / "areal_m2po"
    (pkg / "algo").mkdir(parents=True)
    (pkg / "algo" / "planted.py").write_text(
        "import torch\n\ndef f(x):\n    return x + torch.zeros(3)\n\n"
        "def g(x):\n    return x + torch.zeros(3, device=x.device)\n"
    )
    monkeypatch.setitem(globals(), "PACKAGE", pkg)
    assert _device_less_calls() == Counter({("algo/planted.py", "f"): 1})
    with pytest.raises(AssertionError, match="planted"):
        test_every_device_less_constructor_has_a_reason()
