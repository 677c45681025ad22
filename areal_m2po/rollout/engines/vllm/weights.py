"""Policy weights into vLLM: the tied output layer, the names a full update must cover.

vLLM's CPU backend keeps its own packed copy of a tied ``lm_head`` and refreshes it only when
``lm_head.weight`` is among the loaded tensors: an update carrying the input embedding alone
(what a tied Hugging Face ``state_dict`` may hold) leaves the old output layer in place with no
warning (measured: 0.4-0.55 nats of log-prob error). :func:`with_tied_head` therefore always
adds ``lm_head.weight`` (the embedding) for a tied model, and :class:`NameCheck` refuses an
update that misses a tensor of the model's checkpoint, since vLLM only logs that.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

__all__ = [
    "EMBED_NAME",
    "HEAD_NAME",
    "NameCheck",
    "VersionOnlyState",
    "check_reload",
    "checkpoint_names",
    "checkpoint_shapes",
    "with_tied_head",
]

HEAD_NAME = "lm_head.weight"
EMBED_NAME = "model.embed_tokens.weight"


def with_tied_head(
    named_tensors: Iterable[tuple[str, torch.Tensor]], tied: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """``named_tensors`` once each, plus ``lm_head.weight`` = the input embedding at the end
    when ``tied`` and it did not come (nothing is added for an untied model)."""
    embed: torch.Tensor | None = None
    head_seen = False
    for name, tensor in named_tensors:
        if name == EMBED_NAME:
            embed = tensor
        head_seen = head_seen or name == HEAD_NAME
        yield name, tensor
    if tied and not head_seen:
        if embed is None:
            raise RuntimeError(
                f"vLLM weight update: tied model but neither {HEAD_NAME!r} nor {EMBED_NAME!r} "
                "came; the output layer would silently keep old weights"
            )
        yield HEAD_NAME, embed


def checkpoint_names(model_path: str) -> set[str]:
    """Tensor names of the ``*.safetensors`` files in ``model_path`` (empty if none)."""
    return set(checkpoint_shapes(model_path))


def checkpoint_shapes(model_path: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the ``*.safetensors`` files in ``model_path`` (their headers
    only; empty if none)."""
    from areal_m2po.rollout.common.weight_reader import header_shapes

    shapes: dict[str, tuple[int, ...]] = {}
    if not os.path.isdir(model_path):
        return shapes
    for file in sorted(os.listdir(model_path)):
        if file.endswith(".safetensors"):
            shapes.update(header_shapes(os.path.join(model_path, file)))
    return shapes


def check_reload(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, tuple[int, ...]],
    tied: bool,
    where: str,
) -> None:
    """Refuse (ValueError naming ``where`` and the tensor) an update that vLLM must not load:
    a tensor of the served checkpoint ``expected`` (name -> shape) missing (a tied head
    excepted), one of another shape, or a floating value that is not finite."""
    missing = sorted(n for n in expected if n not in state and not (tied and n == HEAD_NAME))
    if missing:
        raise ValueError(
            f"{where}: no value for {len(missing)} tensors of the served model "
            f"(e.g. {missing[0]!r})"
        )
    for name, value in state.items():
        shape = expected.get(name)
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"{where}: tensor {name!r} has shape {list(value.shape)}, the served model's "
                f"is {list(shape)}"
            )
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{where}: tensor {name!r} holds NaN or infinite values")


class NameCheck:
    """Counts the names an update yields; :meth:`missing` lists expected ones that never came.

    Args:
        expected: the tensor names every full update must hold (the model's checkpoint).
        tied: a tied ``lm_head.weight`` may be absent from ``expected`` and from updates.
    """

    def __init__(self, expected: set[str], tied: bool) -> None:
        self.expected = {n for n in expected if not (tied and n == HEAD_NAME)}
        self.seen: set[str] = set()

    def wrap(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in named_tensors:
            self.seen.add(name)
            yield name, tensor

    def missing(self) -> list[str]:
        return sorted(self.expected - self.seen)


class VersionOnlyState:
    """Recover-checkpoint state of a vLLM engine (in process or servers): only its version.

    vLLM keeps the weights in kernel layout, which cannot be saved; the engine holds the
    trainer's weights of its version, which the checkpoint has, and loads them back. For an
    :class:`~areal_m2po.api.engine_api.InferenceEngine` with a ``_version`` attribute.
    """

    _version: int
    update_weights_from_tensors: Any  # the engine's

    def state_dict(
        self, policy: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> dict[str, Any]:
        """``{"version", "weights": None}``; ``policy`` is consumed to the end (it may be a
        collective gather) and not kept."""
        for _ in policy:
            pass
        if policy_version != self._version:
            raise RuntimeError(
                f"{type(self).__name__} holds version {self._version}, the policy "
                f"{policy_version}: vLLM's weights (kernel layout) are not in the checkpoint"
            )
        return {"version": self._version, "weights": None}

    def load_state_dict(self, state: Mapping[str, Any], policy: Any) -> None:
        """Restore :meth:`state_dict`: load ``policy()`` (or saved weights) as its version."""
        weights = state.get("weights")
        self.update_weights_from_tensors(
            policy() if weights is None else weights, int(state["version"])
        )
