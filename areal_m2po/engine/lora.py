"""LoRA adapters through ``peft``: wrapping a model, the merged weights, adapter saves.

:func:`apply_lora` wraps a Hugging Face model in a ``peft.PeftModel``: every targeted linear
layer ``W`` (``[out, in]``) gets ``A`` (``[r, in]``) and ``B`` (``[out, r]``, zero at start) and
computes ``x W^T + s * x A^T B^T`` with ``s = alpha / r``; only ``A``, ``B`` and the model's
head (a value or score head, not a causal LM's output layer) require gradients, so the
optimizer (built on ``requires_grad`` parameters) holds state for those alone.

The rollout engine and HF saves need plain weights under the base model's names.
:func:`merged_named_tensors` turns the wrapped model's ``(name, tensor)`` stream (its
``state_dict`` items, or the gathered full tensors of an FSDP2-sharded model one at a time) into
that: ``W + s * B @ A`` for every adapted layer, each computed when its three tensors have
passed, so no more than one layer's base weight is held beyond what the consumer keeps; no
second copy of the model is made.

Which rollout engines could take the adapter alone instead: vLLM and SGLang load LoRA
adapters at run time (``--enable-lora`` / ``--lora-paths``) and would accept the adapter's
tensors (:func:`adapter_state_dict`, a few MB); the in-process rollout engine and our rollout
server hold a plain ``transformers`` model and take the merged weights.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from areal_m2po.api.cli_args import LoRAConfig
from areal_m2po.engine.hf_model import as_peft, as_pretrained
from areal_m2po.engine.precision import TORCH_DTYPES

__all__ = [
    "ADAPTER_NAME",
    "LoRAAdapter",
    "adapter_disabled",
    "adapter_state_dict",
    "apply_lora",
    "base_name",
    "is_lora_model",
    "lora_scalings",
    "merged_model_from",
    "merged_named_tensors",
    "save_lora_pretrained",
    "trainable_heads",
]

ADAPTER_NAME = "default"
_PEFT_PREFIX = "base_model.model."
_LORA_A = f".lora_A.{ADAPTER_NAME}.weight"
_LORA_B = f".lora_B.{ADAPTER_NAME}.weight"
_BASE_LAYER = ".base_layer."
_ORIGINAL = ".original_module."
_SAVED = f".modules_to_save.{ADAPTER_NAME}."


def trainable_heads(model: torch.nn.Module) -> list[str]:
    """Top-level modules with parameters besides the model's body, when they are a task head
    (a value or score head trained from scratch), not a causal LM's output layer: they are
    trained in full beside the adapters. ``[]`` for a causal LM."""
    prefix = getattr(model, "base_model_prefix", "model")
    if type(model).__name__.endswith("ForCausalLM"):
        return []
    return [
        name
        for name, child in model.named_children()
        if name != prefix and any(True for _ in child.parameters())
    ]


def apply_lora(model: torch.nn.Module, config: LoRAConfig) -> torch.nn.Module:
    """``model`` wrapped in a ``peft.PeftModel`` with one LoRA adapter (see the module
    docstring); its heads (:func:`trainable_heads`) are trained in full and saved with the
    adapter. Raises ValueError when ``target_modules`` matches no module."""
    from peft import LoraConfig, get_peft_model

    heads = trainable_heads(model)
    lora_config = LoraConfig(
        r=config.r,
        # peft annotates lora_alpha as int, but scales by lora_alpha / r (a float ratio works)
        lora_alpha=config.alpha,  # type: ignore[arg-type]
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules) if config.target_modules else "all-linear",
        exclude_modules=heads or None,
        modules_to_save=heads or None,
        bias="none",
    )
    try:
        return get_peft_model(model, lora_config)
    except ValueError as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise ValueError(f"lora.target_modules={config.target_modules!r}: {first}") from exc


def is_lora_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the module a wrapper keeps in ``.module``) is a ``PeftModel``."""
    from peft import PeftModel

    inner = getattr(model, "module", model)
    return isinstance(model, PeftModel) or isinstance(inner, PeftModel)


def lora_scalings(model: torch.nn.Module) -> dict[str, float]:
    """``{module name: alpha / r}`` of every adapted layer, named as in ``model.state_dict()``
    (``base_model.model.<base name>``). Raises ValueError for a layer kind other than a
    linear layer (``fan_in_fan_out`` or embedding adapters are not merged here)."""
    from peft.tuners.lora import LoraLayer

    out: dict[str, float] = {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or ADAPTER_NAME not in module.scaling:
            continue
        if getattr(module, "fan_in_fan_out", False) or not isinstance(
            module.get_base_layer(), torch.nn.Linear
        ):
            raise ValueError(f"lora: {name} is not a plain linear layer; it cannot be merged")
        out[name] = float(module.scaling[ADAPTER_NAME])
    return out


def base_name(name: str) -> str | None:
    """The base model's name of a ``PeftModel`` state-dict entry, or None for an entry that
    has none of its own (an adapter matrix, the frozen copy of a trained head)."""
    if _ORIGINAL in name or _LORA_A in name or _LORA_B in name:
        return None
    name = name.removeprefix(_PEFT_PREFIX)
    return name.replace(_BASE_LAYER, ".").replace(_SAVED, ".")


def merged_named_tensors(
    named: Iterable[tuple[str, torch.Tensor]], scalings: Mapping[str, float]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged weights under the base model's names from a ``PeftModel``'s
    ``(name, tensor)`` stream (any order); ``scalings`` from :func:`lora_scalings`.

    An adapted layer's weight is yielded as ``W + s * (B @ A)`` (computed in float32, returned
    in ``W``'s dtype and device) once ``W``, ``A`` and ``B`` have all passed; every other entry
    as it is, renamed. Raises ValueError when the stream ends with a layer incomplete.
    """
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in named:
        layer, part = _lora_part(name, scalings)
        if layer is None:
            out = base_name(name)
            if out is not None:
                yield out, tensor
            continue
        parts = pending.setdefault(layer, {})
        parts[part] = tensor
        if len(parts) == 3:
            del pending[layer]
            yield _merge(layer, parts, scalings[layer])
    if pending:
        layer = next(iter(pending))
        raise ValueError(f"lora: {layer} misses {sorted({'W', 'A', 'B'} - set(pending[layer]))}")


def _lora_part(name: str, scalings: Mapping[str, float]) -> tuple[str | None, str]:
    """``(adapted layer, "W" | "A" | "B")`` for the entries that take part in a merge."""
    for suffix, part in ((_LORA_A, "A"), (_LORA_B, "B"), (".base_layer.weight", "W")):
        if name.endswith(suffix):
            layer = name[: -len(suffix)]
            if layer in scalings:
                return layer, part
    return None, ""


def _merge(layer: str, parts: dict[str, torch.Tensor], scaling: float) -> tuple[str, torch.Tensor]:
    weight, a, b = parts["W"], parts["A"], parts["B"]
    delta = b.to(torch.float32) @ a.to(torch.float32).to(b.device)
    merged = (weight.to(torch.float32) + scaling * delta.to(weight.device)).to(weight.dtype)
    name = base_name(f"{layer}.weight")
    assert name is not None
    return name, merged


def adapter_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None):
    """The adapter's tensors (and the trained heads') as peft saves them (``state``: the whole
    ``PeftModel`` state, e.g. gathered from shards; None: the model's own)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, state_dict=dict(state) if state is not None else None)


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run the base model: every adapter (and trained head copy) is bypassed inside."""
    peft = as_peft(model)
    if peft is None:
        raise TypeError(f"{type(model).__name__} carries no LoRA adapter to disable")
    with peft.disable_adapter():
        yield


def save_lora_pretrained(
    model: torch.nn.Module,
    path: str,
    state: Mapping[str, torch.Tensor],
    save_merged: bool,
    tokenizer: Any | None = None,
    merged_subdir: str = "merged",
) -> None:
    """Write the adapter (``adapter_config.json``, ``adapter_model.safetensors``) to ``path``
    and, with ``save_merged``, the merged model in Hugging Face format to
    ``path/<merged_subdir>``; the tokenizer beside both. ``state``: the whole ``PeftModel``
    state (on one process)."""
    # peft keeps the adapter entries
    as_pretrained(model).save_pretrained(path, state_dict=dict(state))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    if not save_merged:
        return
    target = os.path.join(path, merged_subdir)
    merged = dict(merged_named_tensors(state.items(), lora_scalings(model)))
    base = model.get_base_model()  # type: ignore[operator]
    base.save_pretrained(target, state_dict=merged, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(target)


def merged_model_from(
    model: torch.nn.Module,
    named: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    dtype: torch.dtype,
) -> torch.nn.Module:
    """A plain causal LM of ``model``'s base configuration filled from the merged stream of
    ``named`` (one tensor at a time), on ``device``: the unwrapped copy the rollout engine
    starts from."""
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_config(model.config, dtype=dtype).to(device)
    own = plain.state_dict()
    with torch.no_grad():
        for name, value in merged_named_tensors(named, lora_scalings(model)):
            if name in own:
                own[name].copy_(value)
    return plain


class LoRAAdapter:
    """A LoRA adapter on a train engine's model, whichever backend places it: the wrap, the
    merged weights the rollout side and HF saves take, the base model as a reference.

    Args:
        config: the engine's ``lora`` section.
        gradient_checkpointing: the engine checkpoints activations (frozen embeddings then
            need an input gradient).
        dtype: the engine's ``dtype`` key (the merged copy's dtype).
    """

    def __init__(self, config: LoRAConfig, gradient_checkpointing: bool, dtype: str) -> None:
        self.config = config
        self.gradient_checkpointing = gradient_checkpointing
        self.dtype = TORCH_DTYPES[dtype]

    def wrap(self, raw: torch.nn.Module) -> torch.nn.Module:
        """``raw`` with the adapter (:func:`apply_lora`): only the adapters (and a head)
        require gradients."""
        model = apply_lora(raw, self.config)
        if self.gradient_checkpointing:
            as_pretrained(model).enable_input_require_grads()
        return model

    def merged(
        self, model: torch.nn.Module, named: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The merged weights under the base model's names from the unwrapped ``model``'s
        ``(name, tensor)`` stream (:func:`merged_named_tensors`)."""
        return merged_named_tensors(named, lora_scalings(model))

    def merged_model(
        self,
        model: torch.nn.Module,
        named: Iterable[tuple[str, torch.Tensor]],
        device: torch.device,
    ) -> torch.nn.Module:
        """A plain causal LM holding the merged weights (:func:`merged_model_from`)."""
        return merged_model_from(model, named, device, self.dtype)

    def save(
        self,
        model: torch.nn.Module,
        path: str,
        state: Mapping[str, torch.Tensor],
        tokenizer: Any | None = None,
    ) -> None:
        """The adapter to ``path``, and the merged model with ``save_merged``
        (:func:`save_lora_pretrained`)."""
        save_lora_pretrained(model, path, state, self.config.save_merged, tokenizer)

    def disabled(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Run the base model inside (:func:`adapter_disabled`)."""
        return adapter_disabled(model)
