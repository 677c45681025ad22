"""Reading AReaL's SFT, reward-model and DPO files (AReaL's ``SFTConfig``, ``RWConfig`` and
``DPOConfig``) into ``train_sft``, ``train_rm`` and ``train_dpo``.

A file is AReaL's exactly as for the RL trainer (:func:`areal_config.looks_like_areal`: a
marker key such as ``cluster``, ``areal_compat: true``, or ``--areal-compat``). AReaL's three
experiments keep the trained model under ``actor``, where these trainers have ``model``; DPO's
``actor.beta``/``actor.loss_type`` are top-level keys here and its ``ref`` section is
``ref_path``. :func:`reader_for` gives :mod:`areal_m2po.api.config_loader` what it needs per
root config: the defaults an AReaL file gets, the AReaL name of an override written with this
trainer's name (``model.path`` -> ``actor.path``, so overrides beat the file whichever name they
use), and the translation of the merged, resolved tree (:func:`translate`):

* honoured: keys with AReaL's name and meaning (``actor.path`` as ``model.path``, the
  optimizer, ``mb_spec.max_tokens_per_mb``, saver/evaluator/recover frequencies, ...);
* mapped (:data:`TRAINER_MAPPED`): ``actor.backend 'fsdp:dN'``, ``optimizer.type adam``,
  ``attn_impl``, ``is_critic`` (checked), ``train_dataset.type`` (checked),
  ``*_dataset.max_length`` -> ``max_length``, DPO's ``beta``, ``loss_type`` and ``ref``;
* ignored (:data:`TRAINER_IGNORED`): AReaL's cluster, scheduler, workers and file roots, listed
  in the one warning line;
* refused in one line: Megatron, Archon (and its FP8 training), a hybrid MoE allocation, a
  vision-language dataset, a dataset type of another trainer.

AReaL's dataset loaders shape a record without a chat template (``question + answer + EOS``
for gsm8k SFT; hh-rlhf's whole ``chosen``/``rejected`` texts + EOS), so an AReaL file's data
defaults are that layout (:data:`DATASET_DEFAULTS`). Plain dicts only; imports the api package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from areal_m2po.api.areal import config as areal_config
from areal_m2po.api.areal.tree import (
    FROM_SCRATCH,
    MISSING,
    check_equal,
    drop_ignored,
    get,
    lora_section,
    map_optimizer_type,
    map_recover_mode,
    map_train_backend,
    pop,
    put,
)
from areal_m2po.api.config.trainers import DPOConfig, RWConfig, SFTConfig
from areal_m2po.api.errors import ConfigError

__all__ = [
    "DATASET_DEFAULTS",
    "KINDS",
    "TRAINER_IGNORED",
    "TRAINER_MAPPED",
    "ArealReader",
    "reader_for",
    "translate",
]

KINDS: dict[type, str] = {SFTConfig: "sft", RWConfig: "rw", DPOConfig: "dpo"}
"""Root config -> AReaL's experiment kind (also its ``train_dataset.type``)."""

_ENTRY = {"sft": "train_sft", "rw": "train_rm", "dpo": "train_dpo"}

_SECTIONS = ["actor", "ref", "saver", "recover", "evaluator", "stats_logger", "perf_tracer"]
_NAMES = (
    "AReaL's per-section run names and file root; here the top-level experiment_name, "
    "trial_name and output_dir"
)
_NO_SERVER = "an inference server's settings; SFT, reward-model and DPO runs start none"
_LOADER = "AReaL's DataLoader/data-service workers; the records are tokenized up front here"

TRAINER_IGNORED: dict[str, str] = {
    "cluster": "AReaL's cluster (nodes, GPUs per node, file root, name resolution); here "
    "`accelerate launch` starts the processes and output_dir holds the files",
    "scheduler": "AReaL's single-controller scheduler; no scheduler here",
    "launcher": "AReaL's launcher resources (CPUs, memory per GPU)",
    "perf_tracer": "AReaL's performance tracer; timing/* metrics here",
    "memory_profiler": "AReaL's CUDA memory-snapshot profiler",
    "enable_offload": "AReaL's torch_memory_saver offload of colocated engines",
    "name_resolve": "AReaL's name resolution (NFS/etcd)",
    "sglang": _NO_SERVER,
    "vllm": _NO_SERVER,
    **{
        f"{section}.{key}": _NAMES
        for section in _SECTIONS
        for key in ("experiment_name", "trial_name", "fileroot")
    },
    "*.scheduling_spec": "AReaL's worker resources (GPUs, CPUs, memory, command, environment)",
    "*.scheduling_strategy": "AReaL's placement (colocation); the reference sits with the model",
    **{f"*.{key}": _LOADER for key in ("pin_memory", "num_workers", "num_dataset_workers")},
    "*.setup_timeout": "AReaL's remote data-service start-up timeout",
    "*.init_from_scratch": FROM_SCRATCH,
    "actor.mb_spec.granularity": "a micro-batch here never splits an example, and a "
    "preference pair's chosen and rejected rows always stay together",
    "actor.mb_spec.n_mbs_divisor": "how AReaL rounds its micro-batch count (same loss)",
    "actor.mb_spec.packing_algorithm": "how AReaL assigns rows to micro-batches (same loss)",
    "actor.pad_to_maximum": "AReaL's padding of micro-batches to their bound (memory layout)",
    "actor.logprobs_chunk_size": "AReaL's chunking of the log-prob computation (memory)",
    "actor.weight_update_mode": "how AReaL sends weights to inference servers; none here",
}
"""AReaL keys of an SFT/RW/DPO file with no meaning here, and why (``*`` any section; a section
covers its keys): dropped and listed in one warning line."""

_REF_IGNORED = (
    "settings of the frozen reference's engine: here it runs in eval mode with model's "
    "micro-batches and kernels (same log-probs)"
)
_RW_RECOVER = "train_rm writes no resumable checkpoints (AReaL's recover is disabled here)"

TRAINER_MAPPED: dict[str, str] = {
    "actor": "the trained model: model (model.path, model.optimizer, ...)",
    "actor.backend": "'fsdp:dN': model.backend fsdp2 (ddp for d1), model.data_parallel_size N; "
    "train_rm: data parallel over the launched processes",
    "allocation_mode": "as actor.backend (when the file has none)",
    "actor.optimizer.type": "adam: adamw (AReaL's 'adam' is torch.optim.AdamW)",
    "actor.attn_impl": "renamed: model.attn_implementation",
    "actor.is_critic": "checked (true for train_rm, false otherwise), then dropped",
    "actor.use_lora": "true: model.lora {r: lora_rank (32), alpha: lora_alpha (16), "
    "target_modules (empty or all-linear: null)}; false: the LoRA keys are dropped",
    "actor.lora_rank": "as actor.use_lora",
    "actor.lora_alpha": "as actor.use_lora",
    "actor.target_modules": "as actor.use_lora",
    "actor.peft_type": "must be lora (AReaL's only one)",
    "actor.temperature": "must be 1 (AReaL divides the logits of the loss by it), then dropped",
    "train_dataset.type": "checked (sft, rw or dpo: the trainer's), then dropped",
    "valid_dataset.type": "as train_dataset.type",
    "train_dataset.max_length": "max_length (the larger of the two datasets'); a longer "
    "example is an error here, AReaL drops it",
    "valid_dataset.max_length": "as train_dataset.max_length",
    "recover.mode": "on: auto, off: disabled",
    "actor.beta": "renamed: beta (train_dpo)",
    "actor.loss_type": "renamed: loss_type (train_dpo)",
    "ref.path": "ref_path (null when it is actor.path: the start model)",
    "ref.backend": "must equal actor.backend, then dropped",
    "ref.dtype": "must equal actor.dtype, then dropped",
}
"""AReaL keys of an SFT/RW/DPO file rewritten onto this trainer's, and how."""

DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "sft": {"prompt_field": "question", "completion_field": "answer", "use_chat_template": False},
    "rw": {"use_chat_template": False},
    "dpo": {"use_chat_template": False},
}
"""The record layout of AReaL's loaders (gsm8k SFT: ``question + answer + EOS``; hh-rlhf: the
whole texts, no chat template): defaults of an AReaL file's ``train_dataset`` and
``valid_dataset``."""

_VALID_DEFAULTS = {"split": "test", "shuffle": False, "drop_last": False}
"""AReaL's ``ValidDatasetConfig`` defaults."""

_RUN_DEFAULTS: dict[str, Any] = {
    "total_train_steps": None,
    "valid_dataset": None,
    "evaluator.freq_steps": None,
    "evaluator.eval_at_start": False,
    "evaluator.eval_at_end": False,
    "saver.save_at_end": False,
}
"""AReaL's defaults where these trainers' differ in how long a run is and when it evaluates and
saves (the model, data and kernel defaults stay this trainer's)."""

_VLM_DATASETS = ("clevr_count_70k", "geometry3k", "virl39k")
"""AReaL's image datasets (areal/dataset/): a file naming one trains a vision-language model."""


@dataclass(frozen=True)
class ArealReader:
    """How :mod:`areal_m2po.api.config_loader` reads an AReaL file for one root config."""

    apply_defaults: Callable[[dict[str, Any]], None]
    """Set AReaL's defaults into a default tree (before the files merge)."""
    areal_key: Callable[[str], str]
    """The AReaL name of an override key (this trainer's names are accepted too)."""
    translate: Callable[[dict[str, Any], set[str]], list[str]]
    """Rewrite the merged, resolved tree in place, given the root's top-level keys; returns
    the ignored keys."""
    prepare_file: Callable[[dict[str, Any]], dict[str, Any]]
    """One file's mapping as it is merged (the RL trainer's section switches)."""


def reader_for(cls: type) -> ArealReader:
    """The reader of AReaL files for root config ``cls`` (the RL trainer's for any other)."""
    kind = KINDS.get(cls)
    if kind is None:
        return ArealReader(
            areal_config.apply_areal_defaults,
            str,
            areal_config.translate,
            areal_config.with_section_switches,
        )
    return ArealReader(
        lambda tree: _apply_defaults(tree, kind),
        lambda key: _areal_key(key, kind),
        lambda tree, _known: translate(tree, kind),
        lambda data: data,
    )


def _apply_defaults(tree: dict[str, Any], kind: str) -> None:
    defaults = dict(_RUN_DEFAULTS)
    if kind != "rw":
        defaults["recover.freq_steps"] = None
    defaults.update({f"train_dataset.{k}": v for k, v in DATASET_DEFAULTS[kind].items()})
    for key, value in defaults.items():
        put(tree, key, value)


def _areal_key(key: str, kind: str) -> str:
    head, dot, rest = key.partition(".")
    if head == "model" and dot:
        return f"actor.{rest}"
    if kind == "dpo" and key in ("beta", "loss_type"):
        return f"actor.{key}"
    if kind == "dpo" and key == "ref_path":
        return "ref.path"
    if key == "max_length":
        return "train_dataset.max_length"
    return key


# ---------------------------------------------------------------------------------------------
# the translation
# ---------------------------------------------------------------------------------------------


def translate(tree: dict[str, Any], kind: str) -> list[str]:
    """Rewrite a merged, resolved tree holding an AReaL ``kind`` (sft, rw, dpo) file's keys into
    this trainer's, in place. Returns the sorted keys dropped as meaningless here.

    Raises:
        ConfigError: an AReaL feature this trainer does not have (one line naming the key), or
            two keys that disagree.
    """
    tree.pop(areal_config.SWITCH, None)
    _refuse_unsupported(tree)
    ignored = _drop_ignored(tree, kind)
    if kind == "dpo":
        _map_ref(tree)
    _map_backend(tree, kind)
    _map_engine_keys(tree, kind)
    _map_datasets(tree, kind)
    map_recover_mode(tree)
    actor = tree.pop("actor", None)
    if isinstance(actor, dict):
        _merge(tree.setdefault("model", {}), actor)
    return sorted(ignored)


def _merge(tree: dict[str, Any], data: dict[str, Any]) -> None:
    for name, value in data.items():
        if isinstance(value, dict) and isinstance(tree.get(name), dict):
            _merge(tree[name], value)
        else:
            tree[name] = value


def _engine_name(text: str) -> str:
    return text.strip().split(":", 1)[0].lower()


def _refuse_unsupported(tree: dict[str, Any]) -> None:
    """One-line errors for what AReaL has and this trainer does not: Megatron, Archon (FP8),
    hybrid MoE allocations, vision-language datasets."""
    for key in ("train_dataset.path", "valid_dataset.path"):
        path = get(tree, key)
        if isinstance(path, str) and any(name in path.lower() for name in _VLM_DATASETS):
            raise ConfigError(
                key,
                f"{path!r} is one of AReaL's vision-language (VLM) datasets; this trainer "
                "trains text-only causal LMs (no image inputs)",
            )
    for key in ("actor.backend", "allocation_mode"):
        text = get(tree, key)
        if not isinstance(text, str) or _engine_name(text) not in ("megatron", "archon"):
            continue
        engine = _engine_name(text)
        what = f"AReaL's {engine.capitalize()} engine"
        if "(" in text or "|" in text:
            what += " with a hybrid MoE allocation (attention/expert parallel parts)"
        if get(tree, f"actor.{engine}.fp8_config") not in (MISSING, None):
            what += f" (with FP8 training, actor.{engine}.fp8_config)"
        raise ConfigError(
            key,
            f"{text!r}: {what} is not supported; this trainer trains with PyTorch DDP or FSDP2 "
            "over data-parallel processes: use 'fsdp:dN'",
        )
    for engine in ("megatron", "archon"):
        if get(tree, f"actor.{engine}") not in (MISSING, None):
            raise ConfigError(
                f"actor.{engine}",
                f"settings of AReaL's {engine.capitalize()} engine, which is not supported here",
            )


def _drop_ignored(tree: dict[str, Any], kind: str) -> list[str]:
    """Pop every ignored leaf (and the sections left empty); their keys."""
    table = dict(TRAINER_IGNORED)
    if kind == "dpo":
        table["ref.*"] = _REF_IGNORED
    if kind == "rw":
        _check_rw_recover(tree)
        table["recover"] = _RW_RECOVER
    keep = ("ref.path", "ref.backend", "ref.dtype") if kind == "dpo" else ()
    return drop_ignored(tree, table, keep)


def _check_rw_recover(tree: dict[str, Any]) -> None:
    mode = get(tree, "recover.mode")
    if mode not in (MISSING, None, "disabled", "off"):
        raise ConfigError(
            "recover.mode",
            f"{mode!r}: train_rm writes no resumable checkpoints; set recover.mode: disabled",
        )


def _map_ref(tree: dict[str, Any]) -> None:
    """DPO's ``ref`` section: ``ref.path`` -> ``ref_path`` (null for the start model), backend
    and dtype checked equal to the actor's; the rest was dropped with the ignored keys."""
    check_equal(tree, "ref.backend", "actor.backend")
    check_equal(tree, "ref.dtype", "actor.dtype")
    path = pop(tree, "ref.path")
    if path is not MISSING:
        start = get(tree, "actor.path")
        start = get(tree, "model.path") if start is MISSING else start
        tree["ref_path"] = None if path == start else path
    if tree.get("ref") in ({}, None):
        tree.pop("ref", None)


def _map_backend(tree: dict[str, Any], kind: str) -> None:
    alloc = pop(tree, "allocation_mode")
    if isinstance(alloc, str) and alloc and get(tree, "actor.backend") is MISSING:
        if "+" in alloc:
            raise ConfigError(
                "allocation_mode",
                f"{alloc!r} allocates a rollout engine; {_ENTRY[kind]} has none: give the "
                "training part only ('fsdp:dN')",
            )
        put(tree, "actor.backend", alloc)
    text = get(tree, "actor.backend")
    if not isinstance(text, str) or text in ("ddp", "fsdp2"):
        return
    map_train_backend(tree, "actor", text)  # errors for other engines, p/t parallelism
    if kind == "rw":  # the reward model trains data parallel over whatever is launched
        pop(tree, "actor.backend")
        pop(tree, "actor.data_parallel_size")


def _map_engine_keys(tree: dict[str, Any], kind: str) -> None:
    map_optimizer_type(tree, "actor")
    impl = pop(tree, "actor.attn_impl")
    if impl is not MISSING:
        put(tree, "actor.attn_implementation", impl)
    critic = pop(tree, "actor.is_critic")
    want = kind == "rw"
    if critic is not MISSING and critic is not want:
        raise ConfigError(
            "actor.is_critic",
            f"must be {str(want).lower()} for {_ENTRY[kind]} (AReaL's "
            f"{kind.upper()}Config requires it), got {critic!r}",
        )
    _map_lora(tree)
    temperature = pop(tree, "actor.temperature")
    if temperature not in (MISSING, 1, 1.0):
        raise ConfigError(
            "actor.temperature",
            f"{temperature!r}: only 1 is supported (AReaL divides the trained logits by it)",
        )
    if kind == "dpo":
        for name in ("beta", "loss_type"):
            value = pop(tree, f"actor.{name}")
            if value is not MISSING:
                tree[name] = value


_LORA_KEYS = ("use_lora", "lora_rank", "lora_alpha", "target_modules", "peft_type")


def _map_lora(tree: dict[str, Any]) -> None:
    """AReaL's flat LoRA keys as the ``lora`` section (AReaL's defaults: rank 32, alpha 16,
    every linear layer)."""
    found = {name: pop(tree, f"actor.{name}") for name in _LORA_KEYS}
    if found["use_lora"] is not True:
        return  # AReaL reads the other keys only with use_lora
    if found["peft_type"] not in (MISSING, "lora"):
        raise ConfigError(
            "actor.peft_type", f"{found['peft_type']!r}: only lora is supported (as in AReaL)"
        )
    put(tree, "actor.lora", lora_section(found))


def _map_datasets(tree: dict[str, Any], kind: str) -> None:
    lengths = []
    for section in ("train_dataset", "valid_dataset"):
        data = tree.get(section)
        if not isinstance(data, dict):
            continue
        kind_here = data.pop("type", kind)
        if kind_here != kind:
            raise ConfigError(
                f"{section}.type",
                f"{kind_here!r} is AReaL's dataset type for another trainer; {_ENTRY[kind]} "
                f"reads {kind!r} data",
            )
        length = data.pop("max_length", None)
        if length is not None:
            lengths.append(length)
        if section == "valid_dataset":
            for key, value in {**_VALID_DEFAULTS, **DATASET_DEFAULTS[kind]}.items():
                data.setdefault(key, value)
    if lengths:
        tree["max_length"] = max(lengths)
