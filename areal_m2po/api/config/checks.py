"""The field helpers of the configuration tree and the value checks every section uses.

A field carries ``help`` (and, where the value is one of a fixed set, ``choices``) in its
metadata; that metadata drives ``--help``, the generated ``docs/configuration.md`` and
:func:`validate_choices`. Each check raises :class:`ConfigError` with the bare field name; the
loader qualifies it with the section's dotted path.
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import field, fields, is_dataclass
from typing import Any

from areal_m2po.api.errors import ConfigError


def config_field(
    default: Any, help: str, choices: tuple[Any, ...] | None = None, secret: bool = False
) -> Any:
    """A dataclass field with ``help``/``choices`` metadata and a scalar default; a ``secret``
    one is written as null wherever the config is shown or saved (config.yaml, --print-config,
    the wandb config) and left out of its dataclass repr."""
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = choices
    if secret:
        metadata["secret"] = True
    return field(default=default, metadata=metadata, repr=not secret)


def section_field(factory: Any, help: str) -> Any:
    """A nested dataclass field built by ``factory``."""
    return field(default_factory=factory, metadata={"help": help})


# ---------------------------------------------------------------------------------------------
# validation helpers (each raises ConfigError with the bare field name)
# ---------------------------------------------------------------------------------------------


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    if value not in choices:
        raise ConfigError(name, f"must be one of {list(choices)}, got {value!r}")


def check_number(
    name: str,
    value: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    optional: bool = False,
    integer: bool = False,
) -> None:
    if value is None:
        if optional:
            return
        raise ConfigError(name, "must be set, got null")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "an integer" if integer else "a number"
        raise ConfigError(name, f"must be {kind}, got {value!r} ({type(value).__name__})")
    if integer and not isinstance(value, int):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(name, f"must be finite, got {value!r}")
    if gt is not None and not value > gt:
        raise ConfigError(name, f"must be > {gt}, got {value!r}")
    if ge is not None and not value >= ge:
        raise ConfigError(name, f"must be >= {ge}, got {value!r}")
    if lt is not None and not value < lt:
        raise ConfigError(name, f"must be < {lt}, got {value!r}")
    if le is not None and not value <= le:
        raise ConfigError(name, f"must be <= {le}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(name, f"must be true or false, got {value!r}")


def check_str(name: str, value: Any, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise ConfigError(name, f"must be a string, got {value!r}")


def check_nonempty_str(name: str, value: Any, optional: bool = False, null_means: str = "") -> None:
    """A string that is not empty (or ``None`` when ``optional``; ``null_means`` then says what
    ``None`` stands for, e.g. ``"means actor.path"``, in the message)."""
    check_str(name, value, optional)
    if value == "":
        raise ConfigError(
            name, f"must not be empty (null {null_means})" if null_means else "must not be empty"
        )


def expand_home(obj: Any, *names: str) -> None:
    """Expand a leading ``~`` of each path-valued field ``names`` of ``obj`` to the home
    directory (``os.path.expanduser``: the environment, no file), so ``output_dir=~/runs/a``
    is that folder rather than one named ``~``."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, str) and value.startswith("~"):
            setattr(obj, name, os.path.expanduser(value))


def validate_choices(obj: Any) -> None:
    """Check every field that declares ``choices`` in its metadata."""
    for f in fields(obj):
        choices = f.metadata.get("choices")
        if choices is not None:
            check_choice(f.name, getattr(obj, f.name), choices)


def validate_section(obj: Any, name: str, cls: type, optional: bool = False) -> None:
    """Check that a nested section holds an instance of ``cls`` (or ``None`` when ``optional``)."""
    value = getattr(obj, name)
    if value is None and optional:
        return
    if not isinstance(value, cls):
        raise ConfigError(name, f"must be a {cls.__name__} section, got {value!r}")


def section_fields(cls: type) -> list[tuple[str, type, bool]]:
    """``(name, section class, optional)`` of each field of dataclass ``cls`` annotated as a
    section (``XConfig`` or ``XConfig | None``): the required ones in field order, then the
    optional ones."""
    hints = typing.get_type_hints(cls)
    found = []
    for f in fields(cls):
        args = typing.get_args(hints[f.name]) or (hints[f.name],)
        sections = [a for a in args if isinstance(a, type) and is_dataclass(a)]
        if sections:
            found.append((f.name, sections[0], type(None) in args))
    return sorted(found, key=lambda section: section[2])


def validate_sections(obj: object) -> None:
    """:func:`validate_section` for every section field of ``obj`` (its annotation names the
    class), the required ones first."""
    for name, cls, optional in section_fields(type(obj)):
        validate_section(obj, name, cls, optional)


DTYPES = ("float32", "bfloat16", "float16")

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
