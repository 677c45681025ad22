"""Generate the configuration reference in docs/configuration.md from the dataclass metadata.

Every key of :class:`areal_m2po.api.cli_args.PPOConfig` (and of ``RWConfig``, ``SFTConfig`` and ``DPOConfig``), section by section,
as :func:`areal_m2po.api.config_schema.config_keys` yields it (the records ``--help`` prints too):
dotted key, type, default (the effective one in a run, as ``--print-config`` shows it), choices
and help; this script owns only the Markdown layout. The reference replaces whatever lies between the two marker lines of docs/configuration.md; the
hand-written text around them is kept.

    python scripts/gen_config_docs.py            # rewrite the reference in place
    python scripts/gen_config_docs.py --check    # exit 1 if the file is out of date

``tests/docs/test_docs.py`` runs the check, so a field added or changed without regenerating fails CI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from areal_m2po.api.cli_args import DPOConfig, PPOConfig, RWConfig, SFTConfig
from areal_m2po.api.config_schema import ConfigKey, class_summary, config_keys

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED REFERENCE (scripts/gen_config_docs.py) -->"
END = "<!-- END GENERATED REFERENCE -->"
RW_BEGIN = "<!-- BEGIN GENERATED RW REFERENCE (scripts/gen_config_docs.py) -->"
RW_END = "<!-- END GENERATED RW REFERENCE -->"
SFT_BEGIN = "<!-- BEGIN GENERATED SFT REFERENCE (scripts/gen_config_docs.py) -->"
SFT_END = "<!-- END GENERATED SFT REFERENCE -->"
DPO_BEGIN = "<!-- BEGIN GENERATED DPO REFERENCE (scripts/gen_config_docs.py) -->"
DPO_END = "<!-- END GENERATED DPO REFERENCE -->"
_ROOT_COMMANDS = {RWConfig: "train_rm", SFTConfig: "train_sft", DPOConfig: "train_dpo"}
TABLE_HEAD = ["| key | type | default | choices | description |", "|---|---|---|---|---|"]


# ---------------------------------------------------------------------------------------------
# Markdown layout of the schema records (areal_m2po.api.config_schema.config_keys)
# ---------------------------------------------------------------------------------------------


def _code(text: str) -> str:
    return f"`{text}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(record: ConfigKey) -> str:
    """A leaf key's table row."""
    default = _code(record.default_text)
    if record.owner_default_differs:
        default += f" (`{record.owner.__name__}()` alone: {_code(record.declared_default_text)})"
    choices = ", ".join(_code(c) for c in record.choice_texts)
    return (
        f"| {_code(record.key)} | {record.type_text()} | {default} | {choices} | "
        f"{_cell(record.help)} |"
    )


def _heading(record: ConfigKey, level: str) -> list[str]:
    """A section's heading, help, summary and dataclass line."""
    dataclass_line = f"Dataclass: `{record.kind.base.__name__}`."
    if record.section_off:
        dataclass_line += (
            " Off by default (`null`); setting any key below switches it on with the "
            "defaults shown."
        )
    return [
        f"{level} `{record.key}`",
        "",
        f"{_cell(record.help)} {record.summary}".strip(),
        "",
        dataclass_line,
        "",
    ]


def _tables(cls: type, level: str) -> list[str]:
    """Each section's heading followed by the table of its leaf keys, in walk order."""
    lines: list[str] = []
    rows: list[str] = []
    for record in config_keys(cls):
        if not record.is_section:
            rows.append(_row(record))
            continue
        if rows:
            lines += [*TABLE_HEAD, *rows, ""]
            rows = []
        lines += _heading(record, level)
    if rows:
        lines += [*TABLE_HEAD, *rows, ""]
    return lines


def render_reference(cls: type = PPOConfig) -> str:
    """The generated reference (the text between the markers, markers excluded).

    ``PPOConfig`` (``python -m areal_m2po.train``), ``RWConfig`` (``python -m
    areal_m2po.train_rm``), ``SFTConfig`` (``python -m areal_m2po.train_sft``) or ``DPOConfig``
    (``python -m areal_m2po.train_dpo``); all but the first are rendered one heading level
    down.
    """
    if cls is PPOConfig:
        level = "###"
        lines = [
            "",
            "Generated from the field metadata in `areal_m2po/api/config/`; do not edit by",
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
            "Generated from the field metadata in `areal_m2po/api/config/`; do not edit by",
            "hand.",
            "",
            f"#### top level ({_ROOT_COMMANDS[cls]})",
            "",
        ]
    lines += [f"{class_summary(cls)} Dataclass: `{cls.__name__}`.", ""]
    lines += _tables(cls, level)
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
    if SFT_BEGIN in updated:
        updated = splice(updated, render_reference(SFTConfig), SFT_BEGIN, SFT_END)
    if DPO_BEGIN in updated:
        updated = splice(updated, render_reference(DPOConfig), DPO_BEGIN, DPO_END)
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
