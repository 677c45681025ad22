"""The YAML flavour of config files, overrides and rendered defaults.

YAML 1.1 structure (what PyYAML reads) with YAML 1.2 scalars where YAML 1.1 surprises people:
``1e-5`` is a float and only ``true``/``false`` are booleans (``on``, ``yes``, ``off`` stay
strings); a key given twice in one mapping is an error (naming its line), not a silent
overwrite. Dumping quotes strings that would read back as exponent floats (``'1e5'``).
"""

from __future__ import annotations

import re
import typing
from typing import Any

import yaml

__all__ = ["dump_yaml", "flow_yaml", "parse_yaml"]

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
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
    """Safe loader reading ``1e-5`` as a float and only ``true``/``false`` as booleans, and
    refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeLoader, yaml12_bools=True)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue  # '<<' merges may repeat keys on purpose
            key = self.construct_object(key_node)
            first = seen.setdefault(key, key_node)
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first at line {first.start_mark.line + 1}); "
                    "the earlier one would be dropped",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep)


class _Dumper(yaml.SafeDumper):
    """Safe dumper that also quotes strings looking like exponent floats (``'1e5'``)."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeDumper, yaml12_bools=False)


def parse_yaml(text: str) -> Any:
    """Read YAML ``text`` in this flavour. Raises ``yaml.YAMLError`` on invalid YAML."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def dump_yaml(data: Any) -> str:
    """``data`` (plain dicts, lists, scalars) as block YAML, keys in their given order."""
    text = yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return typing.cast(str, text)


def flow_yaml(value: Any) -> str:
    """``value`` as one line of flow YAML, as it is written on the command line: ``1.0e-05``,
    ``null``, ``[a, b]``."""
    text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=10_000).strip()
    return typing.cast(str, text).removesuffix("\n...").removesuffix("...").strip()
