"""What the engines call on a Hugging Face model beyond ``torch.nn.Module``, typed.

``torch.nn.Module.__getattr__`` types every unknown attribute as ``Tensor | Module``, so a call
of ``save_pretrained`` on a model typed ``Module`` does not type-check. The functions here look
through the wrappers (DDP's ``.module``, peft's ``get_base_model()``) and hand back the model
under a protocol that names the methods used, after checking that it has them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, cast

import torch


class PretrainedModel(Protocol):
    """The methods of a ``transformers.PreTrainedModel`` (or a ``peft.PeftModel``, which
    forwards them to its base model) that the engines and trainers call."""

    config: Any

    def save_pretrained(self, save_directory: str, **kwargs: Any) -> Any: ...

    def gradient_checkpointing_enable(self, *args: Any, **kwargs: Any) -> None: ...

    def enable_input_require_grads(self) -> None: ...


class PeftModel(Protocol):
    """The methods of a ``peft.PeftModel`` that the engines call."""

    def get_base_model(self) -> torch.nn.Module: ...

    def disable_adapter(self) -> AbstractContextManager[None]: ...


def as_pretrained(model: torch.nn.Module) -> PretrainedModel:
    """``model`` (a Hugging Face model, possibly a peft wrapper) as a :class:`PretrainedModel`.

    Raises:
        TypeError: naming ``model``'s class when it has no ``save_pretrained``.
    """
    if not callable(getattr(model, "save_pretrained", None)):
        raise TypeError(f"{type(model).__name__} is not a Hugging Face model (no save_pretrained)")
    return cast(PretrainedModel, model)


def unwrap_module(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a wrapper that keeps it in ``.module`` (DDP), else ``model``."""
    inner = getattr(model, "module", model)
    return inner if isinstance(inner, torch.nn.Module) else model


def as_peft(model: torch.nn.Module) -> PeftModel | None:
    """``model`` (looked through DDP's ``.module``) as a :class:`PeftModel`; None when it is not
    a peft wrapper (has no ``get_base_model``)."""
    inner = unwrap_module(model)
    if not callable(getattr(inner, "get_base_model", None)):
        return None
    return cast(PeftModel, inner)


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model under DDP's ``.module`` and peft's ``get_base_model()``."""
    peft = as_peft(model)
    return peft.get_base_model() if peft is not None else unwrap_module(model)


def model_config(model: torch.nn.Module) -> Any:
    """The ``config`` (a ``transformers.PretrainedConfig``) of :func:`base_model`."""
    base = base_model(model)
    config = getattr(base, "config", None)
    if config is None:
        raise TypeError(f"{type(base).__name__} has no config: not a Hugging Face model")
    return config


def output_embeddings(model: torch.nn.Module) -> torch.nn.Module | None:
    """``model.get_output_embeddings()``; None when it has no such method or no head."""
    getter: Callable[[], Any] | None = getattr(model, "get_output_embeddings", None)
    out = getter() if callable(getter) else None
    return out if isinstance(out, torch.nn.Module) else None
