"""A fake accelerator for device tests without a GPU (``tests/support`` is on pytest's pythonpath).

Under :class:`torch._subclasses.fake_tensor.FakeTensorMode` tensors carry a device, shape and
dtype but no data, and an operation that mixes devices raises
``FakeTensorDeviceMismatchError`` exactly where a GPU would refuse it (a 0-dim CPU tensor
mixes, as on a GPU). The fake device is PyTorch's ``privateuseone`` backend renamed
:data:`FAKE_DEVICE`, not ``"cuda"``: on a CPU-only build Python indexing (``x[1:]``,
``x[idx] = v``) asks for a CUDA device guard that does not exist, so a fake ``"cuda"`` tensor
cannot even be sliced; ``privateuseone`` takes a Python device guard.

One thing fake tensors let through that a GPU refuses: a 0-dim CPU tensor passes every device
check, also in ``torch.stack``/``torch.cat`` (a GPU takes it in elementwise operations only);
the static check catches those constructors.

Reading a value (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``) raises
``DataDependentOutputException`` under fake tensors; :class:`HostReads` answers them with
placeholders instead, so the code runs on down one branch, and counts them (on a GPU each is a
host sync). A shape that depends on values (``nonzero``, boolean-mask indexing, ``unique``) is
symbolic (a ``ShapeEnv``), but control flow on it (``if x[mask].numel():``) cannot go on: that
code is listed in fake_algo_cases.DATA_DEPENDENT and checked statically
(tests/unit/test_device_static.py) and by its CPU tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import traceback
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

FAKE_DEVICE = "fakegpu"
"""The fake accelerator's device type (``privateuseone`` renamed)."""


def register_fake_backend() -> None:
    """Make :data:`FAKE_DEVICE` a device type, not reported as an available accelerator (once
    per process, and only in a process started for it: tests/unit/test_fake_device.py)."""
    from torch.utils import backend_registration as reg
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    name = torch._C._get_privateuse1_backend_name()
    if name == FAKE_DEVICE:
        return
    if os.environ.get("AREAL_M2PO_FAKE_DEVICE") != "1":
        raise RuntimeError(
            "the fake device renames privateuseone for the whole process: run its tests "
            "through tests/unit/test_fake_device.py (a child process, AREAL_M2PO_FAKE_DEVICE=1)"
        )
    if name != "privateuseone":
        raise RuntimeError(f"privateuseone is already the {name!r} backend in this process")

    class _Module(reg._DummyBackendModule):  # registered, but not an available accelerator
        def is_available(self) -> bool:
            return False

        def device_count(self) -> int:
            return 0

    class _Hooks(reg._DummyPrivateUse1Hook):
        def is_available(self) -> bool:
            return False

    _setup_privateuseone_for_python_backend(FAKE_DEVICE, backend_module=_Module(), hook=_Hooks())


def _via_host(make: Any) -> Any:
    """``torch.tensor``/``torch.as_tensor`` that build on the host and then make the tensor of
    that shape and dtype on the fake device: fake mode cannot build a Python-backend tensor
    from data or copy a constant to it."""

    def build(data: Any, *args: Any, device: Any = None, **kw: Any) -> torch.Tensor:
        out = make(data, *args, **kw)
        if device is None or torch.device(device).type == "cpu":
            return out if device is None else out.to(device)
        return torch.empty(out.shape, dtype=out.dtype, device=device)  # fake: no data to copy

    return build


def _zeros_list(shape: tuple[Any, ...]) -> Any:
    """Nested lists of zeros of ``shape`` (a data-dependent size counts as 1)."""
    if not shape:
        return 0
    try:
        n = int(shape[0])
    except Exception:  # an unbacked (data-dependent) size
        n = 1
    return [_zeros_list(shape[1:]) for _ in range(n)]


class HostReads:
    """The data-dependent reads made under :func:`fake_device`. Each returns a placeholder, so
    the code runs on down one branch instead of stopping: ``bool`` True (False for an
    ``any()``: the no-error branch of a check), ``int`` 0, ``float`` 0.0, ``item`` 1 (an
    optimizer's step count), ``tolist`` zeros. ``count`` says how many were reads of a device
    tensor (a GPU's host syncs) and ``where`` where they were."""

    def __init__(self) -> None:
        self.count = 0
        self.where: Counter[str] = Counter()  # "file:line" of the read's innermost package frame

    def _record(self) -> None:
        self.count += 1
        for frame in traceback.extract_stack()[::-1]:
            if "/areal_m2po/" in frame.filename or "/torch/optim/" in frame.filename:
                self.where[f"{frame.filename.split('/')[-1]}:{frame.lineno}"] += 1
                return
        self.where["elsewhere"] += 1

    def patch(self, patch: pytest.MonkeyPatch) -> None:
        def read(value: Any) -> Any:
            def method(t: torch.Tensor, *args: Any, **kw: Any) -> Any:
                if t.device.type != "cpu":  # a host tensor's read is no device sync
                    self._record()
                return value(t) if callable(value) else value

            return method

        def any_(t: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
            out = torch.Tensor.any(t, *args, **kw)
            out._fake_truth = False  # type: ignore[attr-defined]  # "is anything wrong?": no
            return out

        patch.setattr(FakeTensor, "any", any_)
        patch.setattr(FakeTensor, "__bool__", read(lambda t: getattr(t, "_fake_truth", True)))
        patch.setattr(FakeTensor, "__int__", read(0))
        patch.setattr(FakeTensor, "__index__", read(0))
        patch.setattr(FakeTensor, "__float__", read(0.0))
        patch.setattr(FakeTensor, "item", read(lambda t: True if t.dtype == torch.bool else 1))
        patch.setattr(FakeTensor, "tolist", read(lambda t: _zeros_list(t.shape)))


@contextlib.contextmanager
def fake_device(
    monkeypatch: pytest.MonkeyPatch, reads: HostReads | None = None
) -> Iterator[torch.device]:
    """Run the block under fake tensors; yields the fake accelerator device. Tensors made
    outside the block may not enter it (``allow_non_fake_inputs=False``). With ``reads``,
    data-dependent reads give placeholders (:class:`HostReads`) instead of raising."""
    register_fake_backend()
    with monkeypatch.context() as patch:
        patch.setattr(torch, "tensor", _via_host(torch.tensor))
        patch.setattr(torch, "as_tensor", _via_host(torch.as_tensor))
        if reads is not None:
            reads.patch(patch)
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        with FakeTensorMode(allow_non_fake_inputs=False, shape_env=ShapeEnv()):
            yield torch.device(FAKE_DEVICE, 0)


def tensors_in(x: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``x`` (nested dicts, lists, tuples, dataclasses), with its path."""
    if isinstance(x, torch.Tensor):
        yield "", x
    elif isinstance(x, dict):
        for k, v in x.items():
            for path, t in tensors_in(v):
                yield f"[{k!r}]{path}", t
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            for path, t in tensors_in(v):
                yield f"[{i}]{path}", t
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            for path, t in tensors_in(getattr(x, f.name)):
                yield f".{f.name}{path}", t


def assert_on(device: torch.device, x: Any, what: str = "output") -> None:
    """Every tensor in ``x`` lives on ``device`` (and there is at least one)."""
    found = list(tensors_in(x))
    assert found, f"{what}: no tensor"
    wrong = [f"{what}{p}: {t.device}" for p, t in found if t.device != device]
    assert not wrong, "tensors off the device: " + ", ".join(wrong)


def module_to_fake(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module``'s real parameters and buffers as fake tensors on ``device`` (call inside
    :func:`fake_device`; the module is changed in place and returned)."""
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode()
    assert mode is not None, "module_to_fake runs inside fake_device()"
    return module._apply(lambda t: mode.from_tensor(t).to(device))
