"""The schema of the configuration tree of :mod:`areal_m2po.api.cli_args`, walked in one place.

:func:`config_keys` yields one :class:`ConfigKey` record per dotted key of a root config
(``PPOConfig``, ``RWConfig``): its type, its default in a run without ``--config``, its choices
and help, as text ready to print. Both renderings of the schema read these records: ``--help``
(:func:`areal_m2po.api.config_loader.format_help`) and the reference in
``docs/configuration.md`` (``scripts/gen_config_docs.py``). The loader checks and converts
values with the same field kinds (:func:`fields_of`) and starts from the same default tree
(:func:`default_tree`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterator
from typing import Any

from areal_m2po.api.errors import ConfigError
from areal_m2po.api.yaml_format import flow_yaml

__all__ = [
    "REQUIRED",
    "ConfigKey",
    "FieldKind",
    "class_summary",
    "config_keys",
    "config_to_dict",
    "default_tree",
    "fields_of",
    "kind_of",
    "section_defaults",
    "value_text",
]


# ---------------------------------------------------------------------------------------------
# field kinds
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FieldKind:
    """A field's type reduced to what loading and documenting need."""

    base: Any  # bool | int | float | str | list | dict | a dataclass type | typing.Any
    optional: bool
    item: Any = None  # element type of a list

    @property
    def is_section(self) -> bool:
        return dataclasses.is_dataclass(self.base)

    @property
    def is_mapping(self) -> bool:
        """A mapping of names to values (``dict[str, Any]``): dotted keys reach into it."""
        return self.base is dict

    def describe(self, *, null_word: str = " or null") -> str:
        """Human name: ``float``, ``list of str``, ``RejectionSamplingConfig section``, with
        ``null_word`` appended when the field may be null."""
        if self.base is list:
            inner = FieldKind(self.item, False).describe() if self.item is not None else "values"
            name = f"list of {inner}"
        elif self.is_section:
            name = f"{self.base.__name__} section"
        elif self.is_mapping:
            name = "mapping"
        elif self.base is Any:
            name = "any value"
        else:
            name = self.base.__name__
        return name + (null_word if self.optional else "")


def kind_of(annotation: Any) -> FieldKind:
    """The :class:`FieldKind` of a type annotation (``float | None``, ``list[str]``, ...)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        inner = kind_of(args[0]) if len(args) == 1 else FieldKind(Any, False)
        return dataclasses.replace(inner, optional=optional or inner.optional)
    if origin is list:
        items = typing.get_args(annotation)
        return FieldKind(list, False, items[0] if items else None)
    if origin is dict or annotation is dict:
        return FieldKind(dict, False)
    if annotation in (bool, int, float, str) or dataclasses.is_dataclass(annotation):
        return FieldKind(annotation, False)
    return FieldKind(Any, False)


def fields_of(cls: type) -> dict[str, tuple[dataclasses.Field[Any], FieldKind]]:
    """Field name -> (field, kind) for the init fields of dataclass ``cls``, in order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, kind_of(hints.get(f.name, Any))) for f in dataclasses.fields(cls) if f.init}


# ---------------------------------------------------------------------------------------------
# defaults as plain trees
# ---------------------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> Any:
    """A dataclass tree as plain nested dicts/lists in field-declaration order; a field marked
    ``secret`` (an API key) is None."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {
            f.name: None if f.metadata.get("secret") else config_to_dict(getattr(cfg, f.name))
            for f in dataclasses.fields(cfg)
        }
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg


class _Required:
    """Marks a field without a default (the user must set it)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()


def _declared_default(f: dataclasses.Field[Any]) -> Any:
    """The default ``f`` declares, as plain data (:data:`REQUIRED` if it has none)."""
    if f.default is not dataclasses.MISSING:
        return config_to_dict(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return config_to_dict(f.default_factory())
    return REQUIRED


def default_tree(cls: type) -> dict[str, Any]:
    """The default tree of ``cls`` from its field declarations.

    Root fields come from their declared defaults, not from an instance, so values that
    ``__post_init__`` derives (``output_dir`` from the experiment name) are derived again after
    the user's settings are merged in.
    """
    return {name: _declared_default(f) for name, (f, _kind) in fields_of(cls).items()}


def section_defaults(cls: type, key: str) -> dict[str, Any]:
    """The plain tree of section ``cls`` built alone (for ``key``, a null section being set)."""
    try:
        return config_to_dict(cls())
    except TypeError as exc:  # a section with required fields
        raise ConfigError(key, f"cannot create the {cls.__name__} section: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------


def value_text(value: Any) -> str:
    """A default or choice as it is written in YAML or on the command line (``1.0e-05``,
    ``null``, ``[a, b]``, ``''``); ``required`` for a field without a default."""
    if value is REQUIRED:
        return "required"
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, str) and value == "":
        return "''"
    return flow_yaml(value)


def class_summary(cls: type) -> str:
    """The first paragraph of ``cls``'s docstring on one line."""
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.split())


# ---------------------------------------------------------------------------------------------
# the walk
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One key of the tree: a leaf field or a section.

    ``default`` is its value in a run without ``--config``, as plain data (``None`` for a
    section that is off, :data:`REQUIRED` for a field without a default); ``declared_default``
    is what ``owner()`` built alone holds, which differs where a parent section's default
    factory sets the field (``actor.m2_threshold``).
    """

    key: str
    owner: type
    kind: FieldKind
    help: str
    choices: tuple[Any, ...] | None
    default: Any
    declared_default: Any

    @property
    def is_section(self) -> bool:
        return self.kind.is_section

    @property
    def section_off(self) -> bool:
        """A section that is null (off) by default; setting a key inside switches it on."""
        return self.is_section and self.default is None

    @property
    def summary(self) -> str:
        """For a section, the first paragraph of its dataclass's docstring; else empty."""
        return class_summary(self.kind.base) if self.is_section else ""

    def type_text(self, null_word: str = " or null") -> str:
        """``float``, ``list of str``, with ``null_word`` appended when the key may be null."""
        return self.kind.describe(null_word=null_word)

    @property
    def default_text(self) -> str:
        return value_text(self.default)

    @property
    def declared_default_text(self) -> str:
        return value_text(self.declared_default)

    @property
    def owner_default_differs(self) -> bool:
        """``owner()`` alone holds another default than a run does (and has one at all)."""
        return self.declared_default is not REQUIRED and self.declared_default != self.default

    @property
    def choice_texts(self) -> tuple[str, ...]:
        return tuple(value_text(c) for c in self.choices or ())


def config_keys(cls: type) -> Iterator[ConfigKey]:
    """Every key of root config ``cls`` with its effective default, depth first.

    Within a section its leaf keys come first, in declaration order, then each sub-section's
    key followed by that sub-section's keys; null sections are walked with the defaults of
    their dataclass built alone (what setting a key inside creates).
    """
    yield from _section_keys(cls, default_tree(cls), "")


def _section_keys(cls: type, values: dict[str, Any], prefix: str) -> Iterator[ConfigKey]:
    leaves: list[ConfigKey] = []
    sections: list[ConfigKey] = []
    for name, (f, kind) in fields_of(cls).items():
        record = ConfigKey(
            key=prefix + name,
            owner=cls,
            kind=kind,
            help=f.metadata.get("help", ""),
            choices=f.metadata.get("choices"),
            default=values.get(name),
            declared_default=_declared_default(f),
        )
        (sections if kind.is_section else leaves).append(record)
    yield from leaves
    for section in sections:
        yield section
        inner = section.default
        if not isinstance(inner, dict):
            inner = section_defaults(section.kind.base, section.key)
        yield from _section_keys(section.kind.base, inner, section.key + ".")
