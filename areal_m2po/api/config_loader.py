"""Loading, printing and documenting the configuration tree of :mod:`areal_m2po.api.cli_args`.

A run's configuration is built in three layers, later ones winning::

    dataclass defaults  <  --config file.yaml  <  command-line overrides

Overrides come in three equivalent forms: ``--actor.m2_threshold=0.05``,
``--actor.m2_threshold 0.05`` and ``actor.m2_threshold=0.05``. Values are read as YAML
(``null``, ``true``/``false``, numbers, ``[a, b]`` lists, ``{k: v}`` mappings), except that a
string field takes the text verbatim. Setting a key inside an optional section that is null
(``actor.rejection_sampling.upper=5``) first creates that section with its defaults. YAML files
and override values may use OmegaConf interpolation (``${gconfig.n_samples}``); a YAML file need
not list every key.

The result is made of the real dataclass instances, so every ``__post_init__`` check runs exactly
as it does for ``ActorConfig(m2_threshold=0.05, ...)`` in Python. Every problem is raised as a
:class:`~areal_m2po.api.cli_args.ConfigError` whose key is the full dotted name of the culprit
(unknown keys come with the nearest valid key).

YAML is read with YAML 1.2 scalars where YAML 1.1 surprises people: ``1e-5`` is a float and only
``true``/``false`` are booleans (``on``, ``yes``, ``off`` stay strings).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import tempfile
import textwrap
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from areal_m2po.api.cli_args import ConfigError, PPOConfig

__all__ = [
    "config_to_dict",
    "config_to_yaml",
    "format_help",
    "leaf_keys",
    "load_config",
    "parse_argv",
    "save_config",
]

_NULL_WORDS = ("null", "Null", "NULL", "~", "None")
_CONFIG_KEY = "config"

# ---------------------------------------------------------------------------------------------
# YAML flavour: YAML 1.1 structure with YAML 1.2 booleans and exponent floats
# ---------------------------------------------------------------------------------------------

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_EXP_FLOAT_RE = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")

_Resolvers = dict[str, list[tuple[str, "re.Pattern[str]"]]]


def _resolvers(base: type, *, yaml12_bools: bool) -> _Resolvers:
    """``base``'s implicit resolvers plus exponent floats (and, optionally, only 1.2 booleans)."""
    table: _Resolvers = {
        first: [(tag, rx) for tag, rx in entries if not (yaml12_bools and tag == _BOOL_TAG)]
        for first, entries in base.yaml_implicit_resolvers.items()  # type: ignore[attr-defined]
    }
    extra = [(_FLOAT_TAG, _EXP_FLOAT_RE, "-+0123456789")]
    if yaml12_bools:
        extra.append((_BOOL_TAG, _BOOL_RE, "tTfF"))
    for tag, rx, firsts in extra:
        for first in firsts:
            table.setdefault(first, []).append((tag, rx))
    return table


class _Loader(yaml.SafeLoader):
    """Safe loader reading ``1e-5`` as a float and only ``true``/``false`` as booleans."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeLoader, yaml12_bools=True)


class _Dumper(yaml.SafeDumper):
    """Safe dumper that also quotes strings looking like exponent floats (``'1e5'``)."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeDumper, yaml12_bools=False)


def _parse_yaml_text(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


# ---------------------------------------------------------------------------------------------
# the schema: field types of the dataclass tree
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Kind:
    """A field's type reduced to what loading needs."""

    base: Any  # bool | int | float | str | list | a dataclass type | typing.Any
    optional: bool
    item: Any = None  # element type of a list

    @property
    def is_section(self) -> bool:
        return dataclasses.is_dataclass(self.base)

    def describe(self, *, null_word: str = " or null") -> str:
        """Human name: ``float``, ``list of str``, ``RejectionSamplingConfig section``."""
        if self.base is list:
            inner = _Kind(self.item, False).describe() if self.item is not None else "values"
            name = f"list of {inner}"
        elif self.is_section:
            name = f"{self.base.__name__} section"
        elif self.base is Any:
            name = "any value"
        else:
            name = self.base.__name__
        return name + (null_word if self.optional else "")


def _kind_of(annotation: Any) -> _Kind:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        inner = _kind_of(args[0]) if len(args) == 1 else _Kind(Any, False)
        return dataclasses.replace(inner, optional=optional or inner.optional)
    if origin is list:
        items = typing.get_args(annotation)
        return _Kind(list, False, items[0] if items else None)
    if annotation in (bool, int, float, str) or dataclasses.is_dataclass(annotation):
        return _Kind(annotation, False)
    return _Kind(Any, False)


def _schema(cls: type) -> dict[str, tuple[dataclasses.Field[Any], _Kind]]:
    """Field name -> (field, kind) for the init fields of dataclass ``cls``, in order."""
    hints = typing.get_type_hints(cls)
    return {
        f.name: (f, _kind_of(hints.get(f.name, Any))) for f in dataclasses.fields(cls) if f.init
    }


def _iter_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, _Kind, dataclasses.Field[Any]]]:
    """Every dotted key of ``cls`` (sections and leaves), depth first, in declaration order."""
    for name, (f, kind) in _schema(cls).items():
        key = f"{prefix}{name}"
        yield key, kind, f
        if kind.is_section:
            yield from _iter_keys(kind.base, key + ".")


def leaf_keys(cls: type = PPOConfig) -> list[str]:
    """All dotted leaf keys of ``cls``, including those inside optional (null) sections."""
    return [key for key, kind, _ in _iter_keys(cls) if not kind.is_section]


def _suggest(key: str, cls: type) -> str:
    """`` (did you mean 'x'?)`` for the nearest valid key, or an empty string."""
    keys = [k for k, _, _ in _iter_keys(cls)]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close:
        last = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == last][:1]
    if not close:
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.4)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _unknown(key: str, root: type) -> ConfigError:
    return ConfigError(key, f"unknown key '{key}'{_suggest(key, root)}")


# ---------------------------------------------------------------------------------------------
# plain trees: defaults, merging YAML and overrides
# ---------------------------------------------------------------------------------------------


def config_to_dict(cfg: Any) -> Any:
    """A dataclass tree as plain nested dicts/lists in field-declaration order."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg


class _Missing:
    """Marks a field without a default (the user must set it)."""

    def __repr__(self) -> str:
        return "<required>"


_REQUIRED = _Missing()


def _defaults(cls: type) -> dict[str, Any]:
    """The default tree of ``cls`` from its field declarations.

    Root fields come from their declared defaults, not from an instance, so values that
    ``__post_init__`` derives (``output_dir`` from the experiment name) are derived again after
    the user's settings are merged in.
    """
    tree: dict[str, Any] = {}
    for name, (f, _kind) in _schema(cls).items():
        if f.default is not dataclasses.MISSING:
            tree[name] = config_to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            tree[name] = config_to_dict(f.default_factory())
        else:
            tree[name] = _REQUIRED
    return tree


def _section_defaults(cls: type, key: str) -> dict[str, Any]:
    try:
        return config_to_dict(cls())  # type: ignore[no-any-return]
    except TypeError as exc:  # a section with required fields
        raise ConfigError(key, f"cannot create the {cls.__name__} section: {exc}") from exc


def _merge_mapping(
    tree: dict[str, Any], data: dict[Any, Any], cls: type, prefix: str, root: type
) -> None:
    """Merge a YAML mapping into the plain tree of ``cls`` (keys checked, values raw)."""
    schema = _schema(cls)
    for name, value in data.items():
        key = f"{prefix}{name}"
        if not isinstance(name, str) or name not in schema:
            raise _unknown(str(key), root)
        _, kind = schema[name]
        if kind.is_section and isinstance(value, dict):
            if not isinstance(tree.get(name), dict):
                tree[name] = _section_defaults(kind.base, key)
            _merge_mapping(tree[name], value, kind.base, key + ".", root)
        else:
            tree[name] = config_to_dict(value)


def _set_override(tree: dict[str, Any], key: str, raw: str, root: type) -> None:
    """Apply one ``key=raw`` override to the plain tree of ``root``."""
    parts = key.split(".")
    node, cls = tree, root
    for depth, part in enumerate(parts):
        schema = _schema(cls)
        if part not in schema:
            raise _unknown(key, root)
        _, kind = schema[part]
        here = ".".join(parts[: depth + 1])
        if depth == len(parts) - 1:
            value = _parse_value(raw, kind)
            if kind.is_section and isinstance(value, dict):
                if not isinstance(node.get(part), dict):
                    node[part] = _section_defaults(kind.base, here)
                _merge_mapping(node[part], value, kind.base, here + ".", root)
            else:
                node[part] = value
            return
        if not kind.is_section:
            raise _unknown(key, root)
        if not isinstance(node.get(part), dict):
            node[part] = _section_defaults(kind.base, here)
        node, cls = node[part], kind.base


def _parse_value(raw: str, kind: _Kind) -> Any:
    """Read an override value: verbatim for string fields, YAML otherwise."""
    if raw in _NULL_WORDS:
        return None
    if kind.base is str:
        return raw
    try:
        return _parse_yaml_text(raw)
    except yaml.YAMLError:
        return raw


# ---------------------------------------------------------------------------------------------
# argv
# ---------------------------------------------------------------------------------------------


def parse_argv(argv: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Split ``argv`` into config files and ``(key, raw_value)`` overrides, in order.

    Accepts ``--config FILE``, ``--config=FILE``, ``--key=value``, ``--key value`` and
    ``key=value``.
    """
    files: list[str] = []
    overrides: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg.startswith("--"):
            body = arg[2:]
            if "=" in body:
                key, value = body.split("=", 1)
            else:
                key = body
                if i >= len(argv) or argv[i].startswith("--"):
                    raise ConfigError(key or arg, f"missing value: use --{key}=VALUE")
                value = argv[i]
                i += 1
        elif "=" in arg and not arg.startswith("-"):
            key, value = arg.split("=", 1)
        else:
            raise ConfigError(arg, "expected KEY=VALUE, --KEY=VALUE or --KEY VALUE")
        if not key:
            raise ConfigError(arg, "empty key")
        if key == _CONFIG_KEY:
            files.append(value)
        else:
            overrides.append((key, value))
    return files, overrides


def _read_yaml_file(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(_CONFIG_KEY, f"no such config file: {path}")
    try:
        data = _parse_yaml_text(file.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        what = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ConfigError(_CONFIG_KEY, f"{where}: invalid YAML: {what}") from exc
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise ConfigError(_CONFIG_KEY, f"{path}: cannot read: {_one_line(exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            _CONFIG_KEY, f"{path}: the top level must be a mapping of keys, got {_show(data)}"
        )
    return data


# ---------------------------------------------------------------------------------------------
# interpolation
# ---------------------------------------------------------------------------------------------


def _has_interpolation(node: Any) -> bool:
    if isinstance(node, dict):
        return any(_has_interpolation(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_interpolation(v) for v in node)
    return isinstance(node, str) and "${" in node


def _resolve(tree: dict[str, Any]) -> dict[str, Any]:
    """Resolve OmegaConf interpolations (``${a.b}``, ``${oc.env:X}``) over the whole tree."""
    if not _has_interpolation(tree):
        return tree
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        resolved = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(str(key), f"cannot resolve interpolation: {_one_line(exc)}") from exc
    assert isinstance(resolved, dict)
    return typing.cast(dict[str, Any], resolved)


# ---------------------------------------------------------------------------------------------
# building the dataclasses
# ---------------------------------------------------------------------------------------------


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list {value!r}" if len(repr(value)) <= 60 else "a list"
    return repr(value)


def _convert(value: Any, kind: _Kind, key: str, root: type) -> Any:
    """Check ``value`` against ``kind`` and convert it (ints to floats, mappings to sections)."""

    def wrong() -> ConfigError:
        return ConfigError(key, f"expected {kind.describe()}, got {_show(value)}")

    if value is _REQUIRED:
        raise ConfigError(key, "is required")
    if value is None:
        if kind.optional or kind.base is Any:
            return None
        raise wrong()
    base = kind.base
    if base is Any:
        return value
    if base is bool:
        if not isinstance(value, bool):
            raise wrong()
        return value
    if isinstance(value, bool) and base in (int, float, str):
        raise wrong()
    if base is int:
        if not isinstance(value, int):
            raise wrong()
        return value
    if base is float:
        if not isinstance(value, (int, float)):
            raise wrong()
        return float(value)
    if base is str:
        if isinstance(value, (int, float)):
            return str(value)
        if not isinstance(value, str):
            raise wrong()
        return value
    if base is list:
        if not isinstance(value, list):
            raise wrong()
        item = _kind_of(kind.item) if kind.item is not None else _Kind(Any, True)
        return [_convert(v, item, f"{key}[{i}]", root) for i, v in enumerate(value)]
    if kind.is_section:
        if isinstance(value, base):
            return value
        if not isinstance(value, dict):
            raise wrong()
        return _build(base, value, key + ".", root)
    raise wrong()  # pragma: no cover - every kind is handled above


def _build(cls: type, data: dict[str, Any], prefix: str, root: type) -> Any:
    """Instantiate ``cls`` from a plain mapping; errors carry the full dotted key."""
    schema = _schema(cls)
    for name in data:
        if name not in schema:
            raise _unknown(f"{prefix}{name}", root)
    kwargs = {
        name: _convert(data[name], kind, f"{prefix}{name}", root)
        for name, (_f, kind) in schema.items()
        if name in data
    }
    section = prefix[:-1]
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise exc.with_prefix(section) from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        raise ConfigError(section or cls.__name__, _one_line(exc)) from None


# ---------------------------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------------------------


def load_config(argv: list[str] | None = None, cls: type = PPOConfig) -> Any:
    """Build ``cls`` from its defaults < ``--config file.yaml`` < command-line overrides.

    ``argv`` defaults to ``sys.argv[1:]``. Several ``--config`` files merge in order; overrides
    apply in order after all files, the last setting of a key winning. Raises
    :class:`ConfigError` (a ``ValueError``) naming the full dotted key of any problem.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    files, overrides = parse_argv(args)
    tree = _defaults(cls)
    for path in files:
        _merge_mapping(tree, _read_yaml_file(path), cls, "", cls)
    for key, raw in overrides:
        _set_override(tree, key, raw, cls)
    return _build(cls, _resolve(tree), "", cls)


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML: every field, in declaration order.

    Loading the result with ``--config`` yields an equal config and the identical YAML.
    """
    text = yaml.dump(
        config_to_dict(cfg),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return typing.cast(str, text)


def save_config(cfg: Any, path: str | os.PathLike[str]) -> Path:
    """Write :func:`config_to_yaml` of ``cfg`` to ``path`` atomically (parents created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(config_to_yaml(cfg))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


_USAGE = """\
usage: python -m areal_m2po.train [--config FILE.yaml] [--print-config] [-h]
                                  [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]

Train a Hugging Face causal LM with PPO/GRPO and M2PO. Settings come from the defaults below,
then --config FILE.yaml, then the KEY=VALUE overrides (the three forms are equivalent).
Values are YAML: null, true/false, numbers, [a, b]; ${a.b} interpolates another key.
Setting a key inside a null section (actor.rejection_sampling.upper=5) creates the section.

options:
  --config FILE.yaml  YAML file with any subset of the keys below (may be repeated)
  --print-config      print the resolved config as YAML and exit
  -h, --help          show this help and exit
"""


def _render_default(value: Any) -> str:
    if value is _REQUIRED:
        return "required"
    if isinstance(value, dict):
        return "{...}"
    if isinstance(value, str) and value == "":
        return "''"
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _help_lines(cls: type, tree: Any, prefix: str, wrap: textwrap.TextWrapper) -> list[str]:
    lines: list[str] = []
    sections: list[tuple[str, _Kind, dataclasses.Field[Any], Any]] = []
    for name, (f, kind) in _schema(cls).items():
        value = tree.get(name) if isinstance(tree, dict) else None
        key = f"{prefix}{name}"
        if kind.is_section:
            sections.append((key, kind, f, value))
            continue
        choices = f.metadata.get("choices")
        head = f"  {key} ({kind.describe(null_word='|null')}, default: {_render_default(value)})"
        lines.append(head)
        text = f.metadata.get("help", "")
        if choices is not None:
            text += " Choices: " + ", ".join(_render_default(c) for c in choices) + "."
        lines.extend(wrap.wrap(text) if text else [])
    for key, kind, f, value in sections:
        doc = (kind.base.__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(doc.split())
        lines.append("")
        note = ""
        if value is None:
            note = " Default: null (off); setting any key below creates it with these defaults."
            value = _section_defaults(kind.base, key)
        lines.append(f"[{key}] {f.metadata.get('help', '')}")
        lines.extend(wrap.wrap(f"{doc}{note}") if doc or note else [])
        lines.extend(_help_lines(kind.base, value, key + ".", wrap))
    return lines


def format_help(cls: type = PPOConfig, usage: str | None = None) -> str:
    """The ``--help`` text: every field by section with its type, effective default and help.

    ``usage`` replaces the head (the usage line and options) of ``python -m areal_m2po.train``.
    """
    wrap = textwrap.TextWrapper(width=100, initial_indent="      ", subsequent_indent="      ")
    body = _help_lines(cls, _defaults(cls), "", wrap)
    head = _USAGE if usage is None else usage
    return f"{head}\n[top level] {cls.__name__}\n" + "\n".join(body) + "\n"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
