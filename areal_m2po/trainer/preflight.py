"""Preflight checks of a run's launch, before any model loads (one line naming the key): the
launch set-up (processes, distributed type, backend) and how the batch splits over processes.

``accelerate launch`` decides the distributed type and the number of processes; the config
decides the backend (``actor.backend`` / ``critic.backend``: ``ddp`` or ``fsdp2``). The engine
applies FSDP2 itself on the process group Accelerate made, so:

* ``--multi_gpu`` (DDP type, ``MULTI_GPU`` / ``MULTI_CPU``) with ``N >= 2`` processes runs
  either backend;
* ``--use_fsdp`` (``FSDP`` type, GPUs only) runs ``backend: fsdp2`` (Accelerate's plugin is
  not used: the model never goes through ``accelerator.prepare``) and refuses ``ddp``;
* DeepSpeed is refused, naming FSDP2 as the way to shard;
* ``fsdp2`` in one process, CPU offload on a run without GPUs and Accelerate's
  ``--mixed_precision`` with ``fsdp2`` (use ``fsdp.param_dtype``) are refused.

:func:`check_extras` refuses a feature whose optional packages are not installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator
from typing import Any

from areal_m2po.api.cli_args import ConfigError, PPOConfig, TrainEngineConfig
from areal_m2po.engine.builtin_models import check_builtin_packages
from areal_m2po.utils.extras import check_config_extras

_MULTI = ("MULTI_GPU", "MULTI_CPU")
_LAUNCH = "accelerate launch --multi_gpu --num_processes N (N >= 2)"


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
    engines = [("actor", config.actor)]
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


def check_extras(config: Any) -> None:
    """Raise :class:`ConfigError` naming the key and the extra to install for the first
    optional feature ``config`` (any trainer's root config) asks for whose packages are
    missing (:mod:`areal_m2po.utils.extras`), a built-in model that cannot be made here, or
    an ``attn_implementation: flash_attention_2`` without the ``flash_attn`` package."""
    check_config_extras(config)
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
