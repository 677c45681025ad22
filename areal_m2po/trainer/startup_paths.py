"""Start-up checks of the paths a run's config names, before any model loads: one
:class:`~areal_m2po.api.errors.ConfigError` line naming the key.

Which keys hold which kind of path follows from the section classes, so a new trainer's
sections are checked without listing them here:

* models: ``path`` and ``tokenizer_path`` of every trained model (``actor``, ``critic``,
  ``model``, ...), the reference (``ref``, or the root ``ref_path``), the distillation teacher
  (``teacher``) and a learned reward (``reward.model``), and the root ``tokenizer_path``. A ``builtin:`` name must be a known built-in; a local directory must
  hold a model (``config.json``, or ``adapter_config.json`` for a LoRA adapter); a path that is
  not a valid Hugging Face hub id (``org/name``) or that starts with ``/``, ``./``, ``../`` or
  ``~`` must exist; a hub id must be in the local cache when ``HF_HUB_OFFLINE`` forbids
  downloading it.
* data: ``path`` of every dataset section: a ``.jsonl``/``.json``/``.parquet`` file must exist,
  and so must a local-looking ``datasets`` directory (built-in and hub names are the loaders').
* ``rollout.vllm.python``: an executable (a path, or a name on ``PATH``).

Sections that are off (null, or ``enabled: false``) are skipped.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from typing import Any

from areal_m2po.api.cli_args import (
    ConfigError,
    DatasetConfig,
    PreferenceDatasetConfig,
    RefConfig,
    RewardModelConfig,
    SFTDatasetConfig,
    TeacherConfig,
    TrainedModelConfig,
    VLLMConfig,
)
from areal_m2po.engine.builtin_models import BUILTIN_PREFIX, SMOLLM2_NAME, TINY_NAME

__all__ = ["check_paths", "config_paths", "looks_local"]

_MODEL_SECTIONS = (TrainedModelConfig, RefConfig, RewardModelConfig, TeacherConfig)
_DATA_SECTIONS = (DatasetConfig, PreferenceDatasetConfig, SFTDatasetConfig)
_DATA_FILES = (".jsonl", ".json", ".parquet")
_MODEL_FILES = ("config.json", "adapter_config.json")
_BUILTIN_MODELS = (SMOLLM2_NAME, TINY_NAME)


def config_paths(section: Any, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """``(dotted key, value, kind)`` of every path ``section`` (a root config) names, kind
    ``model``, ``tokenizer``, ``data`` or ``executable``; sections that are off skipped."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        key = prefix + f.name
        if dataclasses.is_dataclass(value):
            if getattr(value, "enabled", True) is not False:
                yield from config_paths(value, key + ".")
            continue
        if not isinstance(value, str) or value == "":
            continue
        if f.name == "tokenizer_path":
            yield key, value, "tokenizer"
        elif f.name == "ref_path" or (f.name == "path" and isinstance(section, _MODEL_SECTIONS)):
            yield key, value, "model"
        elif f.name == "path" and isinstance(section, _DATA_SECTIONS):
            yield key, value, "data"
        elif f.name == "python" and isinstance(section, VLLMConfig):
            yield key, value, "executable"


def check_paths(config: Any) -> None:
    """Raise :class:`ConfigError` naming the key of the first path of ``config`` (any
    trainer's root config) that cannot be used (see the module docstring)."""
    for key, value, kind in config_paths(config):
        if kind == "data":
            _check_data_path(key, value)
        elif kind == "executable":
            if shutil.which(value) is None:
                raise ConfigError(key, f"{value} is not an executable file (nor on PATH)")
        else:
            _check_model_path(key, value, needs_model=kind == "model")


def looks_local(path: str) -> bool:
    """Whether ``path`` can only be a local path: it starts with ``/``, ``./``, ``../`` or
    ``~``, or is not a valid Hugging Face hub id (``name`` or ``org/name``)."""
    if path.startswith(("/", "./", "../", "~", ".\\")):
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        return True
    return False


def _check_model_path(key: str, path: str, needs_model: bool) -> None:
    if path.startswith(BUILTIN_PREFIX):
        if path[len(BUILTIN_PREFIX) :] not in _BUILTIN_MODELS:
            known = ", ".join(BUILTIN_PREFIX + n for n in _BUILTIN_MODELS)
            raise ConfigError(key, f"unknown built-in model {path!r}; known: {known}")
        return
    if os.path.isdir(path):
        if needs_model and not any(os.path.isfile(os.path.join(path, f)) for f in _MODEL_FILES):
            raise ConfigError(
                key,
                f"{path} holds no config.json: not a Hugging Face model directory (a run "
                "saves its models under <output_dir>/checkpoints/<tag>)",
            )
        return
    if os.path.exists(path):
        raise ConfigError(key, f"{path} is a file; a model is a directory or a hub id")
    if looks_local(path):
        raise ConfigError(
            key, f"{path} does not exist (a local model directory; a hub id looks like org/name)"
        )
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(
        try_to_load_from_cache(path, "config.json"), str
    ):
        raise ConfigError(
            key,
            f"{path} is not a local directory, and the hub model {path!r} is not in the Hugging "
            "Face cache while HF_HUB_OFFLINE=1 forbids downloading it",
        )


def _check_data_path(key: str, path: str) -> None:
    if path.startswith(BUILTIN_PREFIX):
        return
    if path.lower().endswith(_DATA_FILES):
        if not os.path.isfile(path):
            what = "is a directory, not a file" if os.path.isdir(path) else "does not exist"
            raise ConfigError(key, f"data file {path} {what}")
    elif looks_local(path) and not os.path.exists(path):
        raise ConfigError(
            key,
            f"{path} does not exist (a .jsonl/.json/.parquet file or a `datasets` directory)",
        )
