"""Which training keys a resumed run changed since its recover checkpoint was written.

A recover checkpoint records the run's whole config, flattened to dotted leaf keys
(:func:`config_record`). A resume compares it with the new command's config: a change of a key
that shapes what is trained (the loss and its coefficients, the learning rate, thresholds,
lengths, the data, the model) would silently continue a different run under the old run's
name, so the start-up refuses it unless the user allows it explicitly
(``recover.allow_changed_keys``). Keys that only say how or how long the run goes (cadences,
logging, threads, timeouts, servers, micro-batching, the held-out set, the step budget) may
change freely: :func:`free_on_resume` lists them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

__all__ = [
    "Change",
    "changed_training_keys",
    "config_record",
    "describe",
    "free_on_resume",
    "resume_note",
]

_FREE_KEYS = frozenset(
    {
        "experiment_name",
        "trial_name",
        "output_dir",
        "overwrite_output_dir",
        "total_train_epochs",
        "total_train_steps",
        "num_threads",
        "host_mmap_threshold_mib",
        "reward.timeout_s",
        "reward.max_workers",
    }
)
_FREE_SECTIONS = ("saver.", "recover.", "evaluator.", "stats_logger.", "valid_dataset.")
_FREE_NAMES = frozenset(
    {
        # how the same maths is laid out on the machine
        "mb_spec",
        "fsdp",
        "gradient_checkpointing",
        "attn_implementation",
        "max_consecutive_skipped_steps",
        "m2_warn_masked_fraction",
        # where rollouts come from and how long to wait for them
        "server_addrs",
        "n_servers",
        "server_threads",
        "server_device",
        "setup_timeout",
        "request_timeout",
        "health_check_interval",
        "health_check_timeout",
        "tolerate_server_failures",
        "allow_public_host",
        "max_concurrent_rollouts",
        "queue_size",
        "episode_timeout_s",
        "logp_mismatch_freq",
        "python",
        "kv_cache_gib",
        "gpu_memory_utilization",
        "enable_sleep_mode",
    }
)


class Change(NamedTuple):
    """One changed key: ``key`` (dotted), its value in the checkpoint and in this run."""

    key: str
    saved: Any
    current: Any


def free_on_resume(key: str) -> bool:
    """Whether the dotted ``key`` may change when a run resumes (see the module docstring)."""
    return (
        key in _FREE_KEYS
        or key.startswith(_FREE_SECTIONS)
        or any(part in _FREE_NAMES for part in key.split("."))
    )


def _leaves(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for name, item in value.items():
            yield from _leaves(item, f"{prefix}{name}.")
    else:
        yield prefix[:-1], value


def config_record(config: Any) -> dict[str, Any]:
    """``config`` (a root config dataclass, or the mapping a ``config.yaml`` holds) as
    ``{dotted leaf key: value}``, the values as JSON stores them (tuples as lists, other
    objects as strings); keys naming a secret (``api_key``) are left out."""
    tree = config if isinstance(config, Mapping) else dataclasses.asdict(config)
    flat = {k: v for k, v in _leaves(tree, "") if "api_key" not in k}
    return json.loads(json.dumps(flat, default=str))


def changed_training_keys(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """The keys of both records (:func:`config_record`) whose values differ, minus those
    :func:`free_on_resume`, in ``current``'s order. A key only one side has (a version with
    other keys) is not compared."""
    changes = [
        Change(key, saved[key], value)
        for key, value in current.items()
        if key in saved and saved[key] != value
    ]
    changes += _toggled_sections(saved, current)
    return [c for c in changes if not free_on_resume(c.key)]


def _toggled_sections(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """Sections off (a null leaf) on one side and set (keys under it) on the other."""

    def under(key: str, record: Mapping[str, Any]) -> bool:
        return any(k.startswith(key + ".") for k in record)

    turned_on = [
        Change(k, v, "<set>") for k, v in saved.items() if k not in current and under(k, current)
    ]
    turned_off = [
        Change(k, "<set>", v) for k, v in current.items() if k not in saved and under(k, saved)
    ]
    return turned_on + turned_off


def describe(changes: list[Change]) -> str:
    """``key old -> new, ...`` of ``changes`` (values as ``repr``, each cut at 60 characters)."""

    def short(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."

    return ", ".join(f"{c.key} {short(c.saved)} -> {short(c.current)}" for c in changes)


RESUME_NOTE = "# resumed with changed training keys (checkpoint -> this run): "


def resume_note(previous_yaml: str, config: Any) -> str:
    """The comment lines a resumed run's ``config.yaml`` starts with: those of the
    ``previous_yaml`` it replaces (earlier resumes), and one more naming the training keys
    that differ between the two (none when nothing changed). ``""`` when there is nothing to
    note or ``previous_yaml`` does not parse."""
    import yaml

    try:
        previous = yaml.safe_load(previous_yaml)
    except yaml.YAMLError:
        return ""
    if not isinstance(previous, Mapping):
        return ""
    earlier = [line for line in previous_yaml.splitlines() if line.startswith(RESUME_NOTE)]
    changes = changed_training_keys(config_record(previous), config_record(config))
    if changes:
        earlier.append(RESUME_NOTE + describe(changes))
    return "".join(line + "\n" for line in earlier)
