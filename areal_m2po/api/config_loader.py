"""Loading, printing and documenting the configuration tree of :mod:`areal_m2po.api.cli_args`.

A run's configuration is built in three layers, later ones winning::

    dataclass defaults  <  --config file.yaml  <  command-line overrides

Overrides come in three equivalent forms: ``--actor.m2_threshold=0.05``,
``--actor.m2_threshold 0.05`` and ``actor.m2_threshold=0.05``. Values are read as YAML
(``null``, ``true``/``false``, numbers, ``[a, b]`` lists, ``{k: v}`` mappings), except that a
string field takes the text verbatim; an empty value (``actor.m2_threshold=``, often an unset
shell variable) is an error for every key (``null`` unsets one). Setting a key inside an
optional section that is null (``actor.rejection_sampling.upper=5``) first creates that section
with its defaults. Mapping-valued keys (``rollout.workflow_kwargs``) behave like sections: a
dotted key reaches into them (``rollout.workflow_kwargs.max_turns=2``) and a mapping merges
into what is there (``null`` clears them). YAML files and override values may use OmegaConf
interpolation (``${gconfig.n_samples}``); a YAML file need not list every key.

An AReaL config file (one with a top-level key only AReaL has, such as ``cluster``, or with
``areal_compat: true``; or any file with ``--areal-compat``) is read with AReaL's meaning:
:mod:`areal_m2po.api.areal.config` translates its keys and drops those of AReaL's own
machinery, listed in one warning line; in every other file an unknown key stays an error.

The result is made of the real dataclass instances, so every ``__post_init__`` check runs exactly
as it does for ``ActorConfig(m2_threshold=0.05, ...)`` in Python. Every problem is raised as a
:class:`~areal_m2po.api.errors.ConfigError` whose key is the full dotted name of the culprit
(unknown keys come with the nearest valid key).

YAML is read with YAML 1.2 scalars where YAML 1.1 surprises people: ``1e-5`` is a float and only
``true``/``false`` are booleans (``on``, ``yes``, ``off`` stay strings); that flavour lives in
:mod:`areal_m2po.api.yaml_format`. The field kinds, the default tree and the walk over every key
(which ``--help`` renders) live in :mod:`areal_m2po.api.config_schema`.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import tempfile
import textwrap
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from areal_m2po.api.areal import config as areal_config
from areal_m2po.api.areal import trainer_config as areal_trainer_config
from areal_m2po.api.cli_args import PPOConfig
from areal_m2po.api.config_schema import (
    REQUIRED,
    ConfigKey,
    FieldKind,
    config_keys,
    config_to_dict,
    default_tree,
    fields_of,
    kind_of,
    section_defaults,
)
from areal_m2po.api.errors import ConfigError
from areal_m2po.api.removed_keys import accept_removed
from areal_m2po.api.yaml_format import dump_yaml, parse_yaml

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
AREAL_COMPAT_FLAG = "--areal-compat"
"""Read every ``--config`` file and override with AReaL's meaning (:mod:`.areal.config`)."""

# ---------------------------------------------------------------------------------------------
# keys
# ---------------------------------------------------------------------------------------------


def leaf_keys(cls: type = PPOConfig) -> list[str]:
    """All dotted leaf keys of ``cls``, including those inside optional (null) sections."""
    return [record.key for record in config_keys(cls) if not record.is_section]


def _suggest(key: str, cls: type) -> str:
    """`` (did you mean 'x'?)`` for the nearest valid key, or an empty string."""
    keys = [record.key for record in config_keys(cls)]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
    if not close:
        last = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == last][:1]
    # no looser match: 'foo.bar' was offered 'rollout.backend', which it has nothing to do with
    return f" (did you mean '{close[0]}'?)" if close else ""


def _unknown(key: str, root: type) -> ConfigError:
    return ConfigError(key, f"unknown key '{key}'{_suggest(key, root)}")


# ---------------------------------------------------------------------------------------------
# plain trees: merging YAML and overrides
# ---------------------------------------------------------------------------------------------


def _merge_mapping(
    tree: dict[str, Any], data: dict[Any, Any], cls: type, prefix: str, root: type
) -> None:
    """Merge a YAML mapping into the plain tree of ``cls`` (keys checked, values raw)."""
    schema = fields_of(cls)
    for name, value in data.items():
        key = f"{prefix}{name}"
        if not isinstance(name, str) or name not in schema:
            if accept_removed(str(key), value, root is PPOConfig):
                continue
            raise _unknown(str(key), root)
        _, kind = schema[name]
        if kind.is_section and isinstance(value, dict):
            if not isinstance(tree.get(name), dict):
                tree[name] = section_defaults(kind.base, key)
            _merge_mapping(tree[name], value, kind.base, key + ".", root)
        elif kind.is_mapping and isinstance(value, dict) and isinstance(tree.get(name), dict):
            tree[name] = _merged(tree[name], value)
        else:
            tree[name] = config_to_dict(value)


def _merged(base: dict[Any, Any], update: dict[Any, Any]) -> dict[Any, Any]:
    """``base`` with ``update`` merged in, nested mappings merged key by key (a copy)."""
    out = dict(base)
    for k, v in update.items():
        both = isinstance(out.get(k), dict) and isinstance(v, dict)
        out[k] = _merged(out[k], v) if both else config_to_dict(v)
    return out


def _set_override(tree: dict[str, Any], key: str, raw: str, root: type) -> None:
    """Apply one ``key=raw`` override to the plain tree of ``root``."""
    parts = key.split(".")
    node, cls = tree, root
    for depth, part in enumerate(parts):
        schema = fields_of(cls)
        if part not in schema:
            if depth == len(parts) - 1 and accept_removed(
                key, _parse_value(raw, FieldKind(Any, True)), root is PPOConfig
            ):
                return
            raise _unknown(key, root)
        _, kind = schema[part]
        here = ".".join(parts[: depth + 1])
        last = depth == len(parts) - 1
        if (kind.is_mapping or last) and not raw.strip():
            raise ConfigError(key, "empty value (an unset shell variable?); write null to unset it")
        if kind.is_mapping and not last:  # a key inside a mapping
            if not all(parts[depth + 1 :]):
                raise ConfigError(key, "empty name in the dotted key")
            _set_in_mapping(node, part, parts[depth + 1 :], _parse_value(raw, FieldKind(Any, True)))
            return
        if last:
            value = _parse_value(raw, kind)
            if kind.is_section and isinstance(value, dict):
                if not isinstance(node.get(part), dict):
                    node[part] = section_defaults(kind.base, here)
                _merge_mapping(node[part], value, kind.base, here + ".", root)
            elif kind.is_mapping and isinstance(value, dict) and isinstance(node.get(part), dict):
                node[part] = _merged(node[part], value)
            else:
                node[part] = value
            return
        if not kind.is_section:
            raise _unknown(key, root)
        if not isinstance(node.get(part), dict):
            node[part] = section_defaults(kind.base, here)
        node, cls = node[part], kind.base


def _set_in_mapping(node: dict[str, Any], name: str, path: list[str], value: Any) -> None:
    """Set ``node[name][path[0]]...[path[-1]] = value``, creating the mappings on the way."""
    mapping = node.get(name)
    node[name] = mapping = dict(mapping) if isinstance(mapping, dict) else {}
    for part in path[:-1]:
        inner = mapping.get(part)
        mapping[part] = dict(inner) if isinstance(inner, dict) else {}
        mapping = mapping[part]
    mapping[path[-1]] = value


def _parse_value(raw: str, kind: FieldKind) -> Any:
    """Read an override value: verbatim for string fields, YAML otherwise."""
    if raw in _NULL_WORDS:
        return None
    if kind.base is str:
        return raw
    try:
        return parse_yaml(raw)
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
    file = Path(os.path.expanduser(path))  # ``--config=~/x.yaml``: no shell expands that ~
    if not file.is_file():
        raise ConfigError(_CONFIG_KEY, f"no such config file: {path}")
    try:
        data = parse_yaml(file.read_text(encoding="utf-8"))
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


def _convert(value: Any, kind: FieldKind, key: str, root: type) -> Any:
    """Check ``value`` against ``kind`` and convert it (ints to floats, mappings to sections)."""

    def wrong() -> ConfigError:
        return ConfigError(key, f"expected {kind.describe()}, got {_show(value)}")

    if value is REQUIRED:
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
    if base is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise wrong()
        return value
    if base is list:
        if not isinstance(value, list):
            raise wrong()
        item = kind_of(kind.item) if kind.item is not None else FieldKind(Any, True)
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
    schema = fields_of(cls)
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


def load_config(
    argv: list[str] | None = None,
    cls: type = PPOConfig,
    warn: Callable[[str], None] | None = None,
) -> Any:
    """Build ``cls`` from its defaults < ``--config file.yaml`` < command-line overrides.

    ``argv`` defaults to ``sys.argv[1:]``. Several ``--config`` files merge in order; overrides
    apply in order after all files, the last setting of a key winning. An AReaL file
    (or ``--areal-compat``) is read with AReaL's meaning (:func:`_load_areal`);
    ``warn`` gets its one warning line (default: ``warning: ...`` on stderr). Raises
    :class:`ConfigError` (a ``ValueError``) naming the full dotted key of any problem.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    flag = AREAL_COMPAT_FLAG in args
    try:
        files, overrides = parse_argv([a for a in args if a != AREAL_COMPAT_FLAG])
    except ConfigError as exc:  # ``--flag`` without a value: an unknown flag is named so
        if exc.key != "config":
            _set_override(default_tree(cls), exc.key, "null", cls)
        raise
    datas = [_read_yaml_file(path) for path in files]
    if flag or any(areal_config.looks_like_areal(d) for d in datas):
        return _load_areal(datas, overrides, cls, warn or _print_warning)
    tree = default_tree(cls)
    for data in datas:
        _merge_mapping(tree, _without_switch(data), cls, "", cls)
    for key, raw in overrides:
        _set_override(tree, key, raw, cls)
    return _build(cls, _resolve(tree), "", cls)


def _without_switch(data: dict[str, Any]) -> dict[str, Any]:
    """A file's mapping without ``areal_compat: false``."""
    switch = data.get(areal_config.SWITCH, False)
    if switch is not False:
        raise ConfigError(areal_config.SWITCH, f"must be true or false, got {_show(switch)}")
    return {k: v for k, v in data.items() if k != areal_config.SWITCH}


def _load_areal(
    datas: list[dict[str, Any]],
    overrides: list[tuple[str, str]],
    cls: type,
    warn: Callable[[str], None],
) -> Any:
    """``cls`` from AReaL config files and overrides: AReaL's defaults, the files and the
    overrides merged as plain data, interpolations resolved, the keys translated
    (:func:`areal_config.translate`), then checked like any config; the dropped keys are
    reported through ``warn`` in one line. SFT, RW and DPO roots: :mod:`.areal.trainer_config`."""
    reader = areal_trainer_config.reader_for(cls)
    tree = default_tree(cls)
    reader.apply_defaults(tree)
    for data in datas:
        _merge_plain(tree, reader.prepare_file(data))
    for key, raw in overrides:
        node: dict[str, Any] = {}
        _set_plain(node, reader.areal_key(key), _override_value(key, raw, cls))
        _merge_plain(tree, node)
    tree = _resolve(tree)
    ignored = reader.translate(tree, set(default_tree(cls)))
    checked = default_tree(cls)
    reader.apply_defaults(checked)
    _merge_mapping(checked, tree, cls, "", cls)
    cfg = _build(cls, checked, "", cls)
    if ignored:
        warn(
            f"AReaL config: {len(ignored)} keys ignored, they configure AReaL's own cluster, "
            f"scheduler and services (docs/areal_parity.md): {', '.join(ignored)}"
        )
    return cfg


def _set_plain(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set dotted ``key`` in a plain tree, creating the mappings on its way."""
    *parents, last = key.split(".")
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    tree[last] = value


def _merge_plain(tree: dict[str, Any], data: dict[Any, Any]) -> None:
    """Merge a mapping into a plain tree without checking its keys (AReaL's are translated
    afterwards)."""
    for name, value in data.items():
        if isinstance(value, dict) and isinstance(tree.get(name), dict):
            _merge_plain(tree[name], value)
        else:
            tree[name] = config_to_dict(value)


def _override_value(key: str, raw: str, cls: type) -> Any:
    """An override's value for a key that may be AReaL's: verbatim for a string field here,
    YAML otherwise."""
    node_cls: Any = cls
    kind = None
    for part in key.split("."):
        schema = fields_of(node_cls) if node_cls is not None else {}
        if part not in schema:
            kind = None
            break
        kind = schema[part][1]
        node_cls = kind.base if kind.is_section else None
    if kind is not None:
        return _parse_value(raw, kind)
    if raw in _NULL_WORDS:
        return None
    try:
        return parse_yaml(raw)
    except yaml.YAMLError:
        return raw


def _print_warning(message: str) -> None:
    print("warning: " + " ".join(message.split()), file=sys.stderr)


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML: every field, in declaration order.

    Loading the result with ``--config`` yields an equal config and the identical YAML.
    """
    return dump_yaml(config_to_dict(cfg))


def save_config(cfg: Any, path: str | os.PathLike[str], header: str = "") -> Path:
    """Write ``header`` (comment lines) and :func:`config_to_yaml` of ``cfg`` to ``path``
    atomically (parents created)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(header + config_to_yaml(cfg))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


OPTIONS_HELP = """\
options:
  --config FILE.yaml  YAML file with any subset of the keys below (may be repeated)
  --areal-compat      read the files and overrides as AReaL's (automatic for a file with
                      AReaL's cluster/scheduler/... keys; docs/areal_parity.md)
  --print-config      print the resolved config as YAML and exit
  -h, --help          show this help and exit
"""
"""The options part of every entry point's ``--help`` (:func:`format_help` appends it)."""

_USAGE = """\
usage: python -m areal_m2po.train [--config FILE.yaml] [--print-config] [-h]
                                  [KEY=VALUE | --KEY=VALUE | --KEY VALUE ...]

Train a Hugging Face causal LM with PPO/GRPO and M2PO. Settings come from the defaults below,
then --config FILE.yaml, then the KEY=VALUE overrides (the three forms are equivalent).
Values are YAML: null, true/false, numbers, [a, b]; ${a.b} interpolates another key.
Setting a key inside a null section (actor.rejection_sampling.upper=5) creates the section.
"""


def _help_lines(record: ConfigKey, wrap: textwrap.TextWrapper) -> list[str]:
    """A leaf key's head line and wrapped help, or a section's blank line, title and summary."""
    if not record.is_section:
        head = f"  {record.key} ({record.type_text('|null')}, default: {record.default_text})"
        text = _plain(record.help)
        if record.choices is not None:
            text += " Choices: " + ", ".join(record.choice_texts) + "."
        return [head, *(wrap.wrap(text) if text else [])]
    note = ""
    if record.section_off:
        note = " Default: null (off); setting any key below creates it with these defaults."
    about = _plain(f"{record.summary}{note}")
    return ["", f"[{record.key}] {_plain(record.help)}", *(wrap.wrap(about) if about else [])]


_DOC_ROLE = re.compile(r":(?:data|class|func|meth|mod|attr):`~?([^`]+)`")


def _plain(text: str) -> str:
    """Docstring text for a terminal: ``:class:`X``` becomes ``X``, double backquotes go."""
    return _DOC_ROLE.sub(r"\1", text).replace("``", "")


def format_help(cls: type = PPOConfig, usage: str | None = None) -> str:
    """The ``--help`` text: every field by section with its type, effective default and help.

    ``usage`` replaces the head (usage line and description) of ``python -m areal_m2po.train``;
    :data:`OPTIONS_HELP` follows it.
    """
    wrap = textwrap.TextWrapper(width=100, initial_indent="      ", subsequent_indent="      ")
    body = [line for record in config_keys(cls) for line in _help_lines(record, wrap)]
    head = _USAGE if usage is None else usage
    return f"{head}\n{OPTIONS_HELP}\n[top level] {cls.__name__}\n" + "\n".join(body) + "\n"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
