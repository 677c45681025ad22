"""Generate the configuration reference in docs/configuration.md from the dataclass metadata.

Every field of :class:`areal_m2po.api.cli_args.PPOConfig`, section by section: dotted key, type,
default (the effective one in a run, as ``--print-config`` shows it), choices and help. The
reference replaces whatever lies between the two marker lines of docs/configuration.md; the
hand-written text around them is kept.

    python scripts/gen_config_docs.py            # rewrite the reference in place
    python scripts/gen_config_docs.py --check    # exit 1 if the file is out of date

``tests/test_docs.py`` runs the check, so a field added or changed without regenerating fails CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from pathlib import Path
from typing import Any

from areal_m2po.api.cli_args import PPOConfig, RWConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED REFERENCE (scripts/gen_config_docs.py) -->"
END = "<!-- END GENERATED REFERENCE -->"
RW_BEGIN = "<!-- BEGIN GENERATED RW REFERENCE (scripts/gen_config_docs.py) -->"
RW_END = "<!-- END GENERATED RW REFERENCE -->"


# ---------------------------------------------------------------------------------------------
# rendering helpers
# ---------------------------------------------------------------------------------------------


def _type_name(annotation: Any) -> str:
    """``float``, ``int or null``, ``list of str or null``, ``NormConfig section or null``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        inner = [a for a in args if a is not type(None)]
        name = " or ".join(_type_name(a) for a in inner)
        return name + (" or null" if len(inner) < len(args) else "")
    if origin is list:
        (item,) = typing.get_args(annotation) or (Any,)
        return f"list of {_type_name(item)}"
    if dataclasses.is_dataclass(annotation):
        return f"{annotation.__name__} section"
    return getattr(annotation, "__name__", str(annotation))


def _value(value: Any) -> str:
    """A value as it is written in YAML or on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            f"{value:g}" if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6) else repr(value)
        )
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _code(text: str) -> str:
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _doc_summary(cls: type) -> str:
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.split())


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


# ---------------------------------------------------------------------------------------------
# the reference
# ---------------------------------------------------------------------------------------------


def _section_tables(
    cls: type, values: Any, prefix: str, lines: list[str], level: str = "###"
) -> None:
    """The table of ``cls``'s leaf fields under ``prefix``, then its sub-sections, recursively.

    ``values`` is the effective instance in a default run (``None`` for an optional section
    that is off, in which case the class defaults are shown).
    """
    hints = typing.get_type_hints(cls)
    own = {f.name: f for f in dataclasses.fields(cls)}
    rows: list[str] = []
    sections: list[tuple[str, type, Any, dataclasses.Field[Any]]] = []
    for name, f in own.items():
        annotation = hints[name]
        value = getattr(values, name)
        key = prefix + name
        section_cls = _section_class(annotation)
        if section_cls is not None:
            sections.append((key, section_cls, value, f))
            continue
        class_default = _field_default(f)
        default = _code(_value(value))
        if class_default is not dataclasses.MISSING and class_default != value:
            default += f" (`{cls.__name__}()` alone: {_code(_value(class_default))})"
        choices = f.metadata.get("choices")
        choice_text = ", ".join(_code(_value(c)) for c in choices) if choices else ""
        rows.append(
            f"| {_code(key)} | {_type_name(annotation)} | {default} | {choice_text} | "
            f"{_cell(f.metadata.get('help', ''))} |"
        )
    if rows:
        lines += ["| key | type | default | choices | description |", "|---|---|---|---|---|"]
        lines += rows
        lines.append("")
    for key, section_cls, value, f in sections:
        lines.append(f"{level} `{key}`")
        lines.append("")
        lines.append(f"{_cell(f.metadata.get('help', ''))} {_doc_summary(section_cls)}".strip())
        lines.append("")
        lines.append(f"Dataclass: `{section_cls.__name__}`.")
        if value is None:
            lines[-1] += (
                " Off by default (`null`); setting any key below switches it on with the "
                "defaults shown."
            )
            value = section_cls()
        lines.append("")
        _section_tables(section_cls, value, key + ".", lines, level)


def _section_class(annotation: Any) -> type | None:
    """The dataclass a field holds (``X`` or ``X | None``), or None for a leaf."""
    if dataclasses.is_dataclass(annotation):
        return annotation  # type: ignore[return-value]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return inner[0]  # type: ignore[no-any-return]
    return None


def render_reference(cls: type = PPOConfig) -> str:
    """The generated reference (the text between the markers, markers excluded).

    ``PPOConfig`` (``python -m areal_m2po.train``) or ``RWConfig`` (``python -m
    areal_m2po.train_rm``, rendered one heading level down).
    """
    defaults = {f.name: _field_default(f) for f in dataclasses.fields(cls)}
    root = cls(**defaults)
    # __post_init__ derives output_dir; document the declared default (null = derived)
    root.output_dir = defaults.get("output_dir", root.output_dir)  # type: ignore[attr-defined]
    if cls is PPOConfig:
        level = "###"
        lines = [
            "",
            "Generated from the field metadata in `areal_m2po/api/cli_args.py`; do not edit by",
            "hand. Defaults are those of a run without `--config` (the built-in demo); where the",
            "dataclass built alone in Python has another default, it is given in parentheses.",
            "",
            "### top level",
            "",
        ]
    else:
        level = "####"
        lines = [
            "",
            "Generated from the field metadata in `areal_m2po/api/cli_args.py`; do not edit by",
            "hand.",
            "",
            "#### top level (train_rm)",
            "",
        ]
    lines += [f"{_doc_summary(cls)} Dataclass: `{cls.__name__}`.", ""]
    _section_tables(cls, root, "", lines, level)
    return "\n".join(lines).rstrip("\n") + "\n"


def splice(document: str, reference: str, begin: str = BEGIN, end: str = END) -> str:
    """``document`` with the text between the markers replaced by ``reference``."""
    try:
        head, rest = document.split(begin + "\n", 1)
        _old, tail = rest.split(end, 1)
    except ValueError:
        raise SystemExit(f"{DOC}: the marker lines {begin!r} / {end!r} are missing") from None
    return f"{head}{begin}\n{reference}{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--path", type=Path, default=DOC, help="the document to update")
    args = parser.parse_args(argv)
    current = args.path.read_text(encoding="utf-8")
    updated = splice(current, render_reference())
    if RW_BEGIN in updated:
        updated = splice(updated, render_reference(RWConfig), RW_BEGIN, RW_END)
    if args.check:
        if updated != current:
            print(f"{args.path} is out of date: run python scripts/gen_config_docs.py")
            return 1
        print(f"{args.path} is up to date")
        return 0
    if updated != current:
        args.path.write_text(updated, encoding="utf-8")
        print(f"updated {args.path}")
    else:
        print(f"{args.path} already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
