"""The plain-tree helpers the AReaL config readers share (:mod:`.config`, :mod:`.sections`,
:mod:`.trainer_config`): dotted access, pattern tables, dropping ignored leaves, and the
rewrites every AReaL file gets alike (backend strings, ``optimizer.type: adam``,
``recover.mode: on/off``, AReaL's flat LoRA keys). Plain dicts only; imports
:mod:`areal_m2po.api.errors`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping
from typing import Any

from areal_m2po.api.errors import ConfigError

__all__ = [
    "FROM_SCRATCH",
    "LORA_DEFAULTS",
    "MISSING",
    "check_equal",
    "drop_ignored",
    "get",
    "leaf_items",
    "lora_section",
    "map_optimizer_type",
    "map_recover_mode",
    "map_train_backend",
    "matches",
    "parse_allocation",
    "pop",
    "pop_leaf",
    "put",
    "rule",
]

FROM_SCRATCH = "only false is supported (the weights at path are loaded)"
"""Why ``*.init_from_scratch`` is ignored (and refused unless false)."""

LORA_DEFAULTS = {"lora_rank": 32, "lora_alpha": 16}
"""AReaL's ``TrainEngineConfig`` defaults of the flat LoRA keys."""

MISSING = object()


def get(tree: Mapping[str, Any], key: str) -> Any:
    """The value at dotted ``key``, or :data:`MISSING`."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def pop(tree: Any, key: str) -> Any:
    """Remove and return the value at dotted ``key`` (:data:`MISSING` when absent, or when
    ``tree`` is no dict)."""
    *parents, last = key.split(".")
    node: Any = tree
    for part in parents:
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    if not isinstance(node, dict):
        return MISSING
    return node.pop(last, MISSING)


def put(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` to ``value``, creating (or replacing non-mapping) parents."""
    *parents, last = key.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def matches(key: str, pattern: str) -> bool:
    """Whether ``key`` is ``pattern`` (``*`` any part) or lies under it."""
    return fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(key, pattern + ".*")


def rule(key: str, table: Mapping[str, str]) -> str | None:
    """The first pattern of ``table`` that ``key`` :func:`matches`, or None."""
    return next((p for p in table if matches(key, p)), None)


def leaf_items(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a nested mapping (lists and empty mappings
    are leaves)."""
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and value:
            yield from leaf_items(value, key + ".")
        else:
            yield key, value


def pop_leaf(tree: dict[str, Any], key: str) -> None:
    """Remove the dotted ``key`` from ``tree`` and every section that leaves empty."""
    pop(tree, key)
    parent = key.rpartition(".")[0]
    while parent and get(tree, parent) == {}:
        pop(tree, parent)
        parent = parent.rpartition(".")[0]


_ALLOCATION = re.compile(r"^(?:(?P<engine>[a-z_0-9]+)[:.])?(?P<dims>(?:[a-z]\d+)+)$")


def parse_allocation(key: str, text: str) -> tuple[str | None, dict[str, int]]:
    """``(engine or None, {letter: size})`` of an AReaL allocation string like
    ``sglang:d4p1t1``; each of d (data), p (pipeline), t (tensor) defaults to 1."""
    match = _ALLOCATION.match(text.strip())
    if match is None and "(" in text:  # AReaL's hybrid MoE syntax, '(attn:...|ffn:...)'
        engine = text.partition(":")[0].strip() if ":" in text.partition("(")[0] else None
        raise ConfigError(
            key,
            f"{text!r}: a hybrid MoE allocation (separate attention/expert parallelism"
            f"{', ' + engine + ' backend' if engine else ''}) is not supported; this trainer "
            "shards with FSDP2 over data-parallel processes only",
        )
    if match is None:
        raise ConfigError(
            key, f"{text!r} is not an AReaL backend string like 'fsdp:d4p1t1' or 'vllm:d1p1t1'"
        )
    dims = {"d": 1, "p": 1, "t": 1}
    for letter, size in re.findall(r"([a-z])(\d+)", match["dims"]):
        dims[letter] = int(size)
    extra = [f"{k}{v}" for k, v in dims.items() if k not in "dpt" and v != 1]
    if extra:
        raise ConfigError(
            key, f"{text!r}: {', '.join(extra)} (context/expert parallel) is not supported"
        )
    return match["engine"], dims


def map_train_backend(tree: dict[str, Any], section: str, text: str) -> None:
    """AReaL's training backend string ``text`` of ``section`` (``fsdp``, ``fsdp:dN``) as
    ``backend`` fsdp2 (ddp for d1) and ``data_parallel_size`` N; other engines and
    pipeline/tensor parallelism refused in one line."""
    key = f"{section}.backend"
    if text.strip() == "fsdp":
        put(tree, key, "fsdp2")
        return
    engine, dims = parse_allocation(key, text)
    if engine not in (None, "fsdp"):
        raise ConfigError(
            key,
            f"{text!r}: the {engine} backend is not supported; this trainer shards with FSDP2 "
            f"over data-parallel processes: use 'fsdp:dN'",
        )
    if dims["p"] != 1 or dims["t"] != 1:
        raise ConfigError(
            key,
            f"{text!r}: pipeline/tensor parallelism (p{dims['p']}, t{dims['t']}) is not "
            "supported; this trainer shards with FSDP2 over data-parallel processes only",
        )
    put(tree, key, "fsdp2" if dims["d"] > 1 else "ddp")
    put(tree, f"{section}.data_parallel_size", dims["d"])


def check_equal(tree: dict[str, Any], key: str, target: str, want: Any = MISSING) -> None:
    """Pop AReaL's ``key``, which repeats ``target`` here: a one-line error unless equal to
    ``target``'s value (or ``want`` when given)."""
    value = pop(tree, key)
    if value is MISSING:
        return
    if want is MISSING:
        want = get(tree, target)
    if value != want:
        raise ConfigError(
            key,
            f"must equal {target} ({want!r}): this trainer has one setting for both, got {value!r}",
        )


def drop_ignored(
    tree: dict[str, Any], table: Mapping[str, str], keep: tuple[str, ...] = ()
) -> list[str]:
    """Pop every leaf ``table`` matches (but those in ``keep``) and the sections that leaves
    empty; their keys, sorted.

    Raises:
        ConfigError: an ``init_from_scratch`` other than false.
    """
    dropped = []
    for key, value in list(leaf_items(tree)):
        if key in keep or rule(key, table) is None:
            continue
        if key.endswith("init_from_scratch") and value not in (False, None):
            raise ConfigError(key, f"{value!r} is not supported: {FROM_SCRATCH}")
        pop_leaf(tree, key)
        dropped.append(key)
    return sorted(dropped)


def map_optimizer_type(tree: dict[str, Any], section: str) -> None:
    """``{section}.optimizer.type``: AReaL's ``adam`` (torch's AdamW) as ``adamw``;
    ``adam_bf16`` refused."""
    key = f"{section}.optimizer.type"
    kind = get(tree, key)
    if kind == "adam":
        put(tree, key, "adamw")
    elif kind == "adam_bf16":
        raise ConfigError(key, "'adam_bf16' (bf16 optimizer states) is not supported; use adam")


def map_recover_mode(tree: dict[str, Any]) -> None:
    """AReaL's ``recover.mode`` on/off as auto/disabled."""
    mode = get(tree, "recover.mode")
    if mode in ("on", "off"):
        put(tree, "recover.mode", "auto" if mode == "on" else "disabled")


def lora_section(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The ``lora`` section of AReaL's flat keys (``lora_rank``, ``lora_alpha``,
    ``target_modules``; :data:`MISSING` for absent ones; AReaL's defaults rank 32, alpha 16;
    none, empty or all-linear modules: null, every linear layer but the output head)."""
    rank, alpha = flat.get("lora_rank", MISSING), flat.get("lora_alpha", MISSING)
    modules = flat.get("target_modules", MISSING)
    if modules in (MISSING, None, [], ["all-linear"], "all-linear"):
        modules = None
    return {
        "r": LORA_DEFAULTS["lora_rank"] if rank is MISSING else rank,
        "alpha": LORA_DEFAULTS["lora_alpha"] if alpha is MISSING else alpha,
        "target_modules": modules,
    }
