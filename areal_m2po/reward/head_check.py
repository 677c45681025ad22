"""Whether a reward model's folder holds a trained score head, read from its files' headers
before any model loads.

``AutoModelForSequenceClassification.from_pretrained`` accepts any causal LM and adds a freshly
initialised ``score`` head to it, so a policy's checkpoint or an SFT LoRA adapter given as
``reward.model.path`` would train PPO against random scores. :func:`check_score_head` refuses
such a folder: its weights (the safetensors headers, a shard index, or a ``.bin`` file's keys)
must hold a head tensor (``score.weight``, or ``classifier``'s of encoder classifiers), and an
adapter must be a sequence-classification one that saved its head.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable

from areal_m2po.api.errors import ConfigError

__all__ = ["check_score_head", "weight_names"]

_HEAD_SUFFIXES = ("score.weight", "classifier.weight", "classifier.out_proj.weight")
_MAX_HEADER = 100 * 1024 * 1024  # bytes; a safetensors header is far smaller
_TRAIN_ONE = "train one with python -m areal_m2po.train_rm and give its checkpoints/final"


def _safetensors_names(file: str) -> list[str]:
    """The tensor names in the header of the safetensors ``file`` (8-byte little-endian
    length, then that many bytes of JSON)."""
    with open(file, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        if size > _MAX_HEADER:
            raise ValueError(f"{file}: a safetensors header of {size} bytes")
        header = json.loads(fh.read(size))
    return [k for k in header if k != "__metadata__"]


def weight_names(folder: str, prefix: str = "model") -> list[str] | None:
    """The tensor names of the weights ``<prefix>.safetensors`` (or its shard index, or
    ``pytorch_model.bin`` for ``prefix="model"``) in ``folder``; None when it has none of
    them."""
    stem = os.path.join(folder, prefix)
    for index in (
        f"{stem}.safetensors.index.json",
        os.path.join(folder, "pytorch_model.bin.index.json"),
    ):
        if os.path.isfile(index):
            with open(index) as fh:
                return list(json.load(fh).get("weight_map", {}))
    if os.path.isfile(f"{stem}.safetensors"):
        return _safetensors_names(f"{stem}.safetensors")
    binary = os.path.join(folder, "pytorch_model.bin" if prefix == "model" else f"{prefix}.bin")
    if os.path.isfile(binary):
        import torch

        return list(torch.load(binary, map_location="cpu", weights_only=True, mmap=True))
    return None


def _has_head(names: Iterable[str]) -> bool:
    return any(n.endswith(_HEAD_SUFFIXES) for n in names)


def _local_folder(path: str) -> str | None:
    """``path`` as a local folder: itself, or a hub id's snapshot in the Hugging Face cache;
    None when it is neither (the path check says what is wrong with it)."""
    if os.path.isdir(path):
        return path
    try:
        from huggingface_hub import try_to_load_from_cache

        config = try_to_load_from_cache(path, "config.json")
    except Exception:  # noqa: BLE001 - not a hub id: nothing to read here
        return None
    return os.path.dirname(config) if isinstance(config, str) else None


def check_score_head(key: str, path: str | None) -> None:
    """Raise :class:`ConfigError` naming ``key`` when the reward model at ``path`` has no
    trained score head (a causal LM's checkpoint, an adapter of one). ``builtin:`` models are
    let through: the tests score with a seeded fresh head on them on purpose."""
    if not path or path.startswith("builtin:"):
        return
    folder = _local_folder(path)
    if folder is None:
        return
    try:
        problem = _problem(folder)
    except (OSError, ValueError, RuntimeError) as exc:
        raise ConfigError(key, f"{path}: its weights cannot be read ({exc})") from None
    if problem:
        raise ConfigError(key, f"{path} is not a reward model: {problem}; {_TRAIN_ONE}")


def _problem(folder: str) -> str | None:
    """What is wrong with ``folder`` as a trained reward model, or None."""
    adapter = os.path.join(folder, "adapter_config.json")
    if os.path.isfile(adapter) and not os.path.isfile(os.path.join(folder, "config.json")):
        with open(adapter) as fh:
            task = json.load(fh).get("task_type")
        adapter_names = weight_names(folder, "adapter_model") or []
        if task == "SEQ_CLS" and _has_head(adapter_names):
            return None
        merged = os.path.join(folder, "merged")
        hint = f" (its merged model {merged} may be)" if os.path.isdir(merged) else ""
        return f"a LoRA adapter of task_type {task!r} without a trained score head{hint}"
    names = weight_names(folder)
    if names is None:
        return None  # no weights we can read (a format transformers knows): let it load
    if _has_head(names):
        return None
    with open(os.path.join(folder, "config.json")) as fh:
        architectures = json.load(fh).get("architectures") or ["?"]
    return (
        f"its weights hold no score head (no score.weight; architecture {architectures[0]}), "
        "so it would score with a randomly initialised one"
    )
