"""The schema walk (areal_m2po.api.config_schema): one record per key, read by both ``--help``
and the generated reference in docs/configuration.md."""

from __future__ import annotations

import dataclasses
import runpy
import typing
from pathlib import Path
from typing import Any

import pytest

from areal_m2po.api.cli_args import (
    ActorConfig,
    DPOConfig,
    PPOConfig,
    RejectionSamplingConfig,
    RWConfig,
)
from areal_m2po.api.config_loader import format_help, load_config
from areal_m2po.api.config_schema import REQUIRED, ConfigKey, config_keys, value_text
from areal_m2po.api.yaml_format import parse_yaml

REPO = Path(__file__).resolve().parents[2]


def _records(cls: type) -> dict[str, ConfigKey]:
    records = list(config_keys(cls))
    by_key = {r.key: r for r in records}
    assert len(by_key) == len(records), "a key was yielded twice"
    return by_key


def _dotted_keys(cls: type, prefix: str = "") -> set[str]:
    """Every dotted key of ``cls`` (sections included), walked independently of the schema."""
    keys: set[str] = set()
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        keys.add(prefix + f.name)
        inner = [a for a in typing.get_args(hints[f.name]) if a is not type(None)]
        held = inner[0] if len(inner) == 1 else hints[f.name]
        if dataclasses.is_dataclass(held):
            keys |= _dotted_keys(typing.cast(type, held), prefix + f.name + ".")
    return keys


@pytest.mark.parametrize("root", [PPOConfig, RWConfig, DPOConfig], ids=lambda c: c.__name__)
def test_one_record_per_key(root: type) -> None:
    assert set(_records(root)) == _dotted_keys(root)


def test_a_section_lists_its_leaves_before_its_sub_sections() -> None:
    order = [r.key for r in config_keys(PPOConfig)]
    # importance_sampling_level is declared after the rejection_sampling section in ActorConfig
    assert order.index("actor.importance_sampling_level") < order.index("actor.rejection_sampling")
    # a section's own keys follow its record directly
    at = order.index("actor.rejection_sampling")
    names = [f.name for f in dataclasses.fields(RejectionSamplingConfig)]
    assert order[at + 1 : at + 1 + len(names)] == [f"actor.rejection_sampling.{n}" for n in names]
    assert order[0] == "experiment_name"


def test_record_of_a_leaf_set_by_its_parents_factory() -> None:
    r = _records(PPOConfig)["actor.m2_threshold"]
    assert (r.owner, r.is_section, r.default, r.declared_default) == (
        ActorConfig,
        False,
        0.04,
        None,
    )
    assert r.type_text() == "float or null" and r.type_text("|null") == "float|null"
    assert (r.default_text, r.declared_default_text) == ("0.04", "null")
    assert r.owner_default_differs
    (declared,) = [f for f in dataclasses.fields(ActorConfig) if f.name == "m2_threshold"]
    assert r.help == declared.metadata["help"] and r.help.startswith("M2PO")


def test_record_choices_and_unchanged_defaults() -> None:
    records = _records(PPOConfig)
    scope = records["actor.m2_scope"]
    assert scope.choices == ("global", "microbatch")
    assert scope.choice_texts == ("global", "microbatch")
    assert not scope.owner_default_differs
    lr = records["actor.optimizer.lr"]
    assert (lr.type_text(), lr.default_text, lr.choice_texts) == ("float", "1.0e-05", ())
    assert records["gconfig.stop"].type_text() == "list of str or null"
    # root fields: the declared default, not what __post_init__ derives from the names
    out = records["output_dir"]
    assert out.default is None and out.default_text == "null" and not out.owner_default_differs


def test_section_records() -> None:
    records = _records(PPOConfig)
    rs = records["actor.rejection_sampling"]
    assert rs.is_section and rs.section_off and rs.default is None
    assert rs.summary == (
        "Masked / truncated importance sampling over the behaviour-vs-proximal discrepancy."
    )
    # keys inside a null section carry the defaults of the section built alone
    upper = records["actor.rejection_sampling.upper"]
    assert upper.default == RejectionSamplingConfig().upper == upper.declared_default
    actor = records["actor"]
    assert actor.is_section and not actor.section_off and isinstance(actor.default, dict)
    assert actor.type_text() == "ActorConfig section"
    model = _records(RWConfig)["model"]
    assert model.summary.startswith("The reward model being trained: ``AutoModelFor")
    assert "\n" not in model.summary  # the first paragraph, on one line
    assert _records(RWConfig)["valid_dataset"].section_off


def _live_value(cfg: Any, record: ConfigKey) -> Any:
    """The value of ``record.key`` in ``cfg``; inside a null section, in the section built
    alone."""
    node = cfg
    for part in record.key.split(".")[:-1]:
        node = getattr(node, part)
        if node is None:
            return getattr(record.owner(), record.key.rsplit(".", 1)[1])
    return getattr(node, record.key.rsplit(".", 1)[-1])


@pytest.mark.parametrize("root", [PPOConfig, RWConfig, DPOConfig], ids=lambda c: c.__name__)
def test_default_texts_read_back_as_the_loaded_defaults(root: type) -> None:
    """Each leaf's default text is YAML that reads back as the value a run without --config
    holds (output_dir aside: derived from the names after loading)."""
    cfg = load_config([], cls=root)
    for record in config_keys(root):
        if record.is_section or record.key == "output_dir":
            continue
        expected = _live_value(cfg, record)
        assert parse_yaml(record.default_text) == expected, record.key


def test_value_text() -> None:
    assert value_text(None) == "null"
    assert value_text(True) == "true" and value_text(False) == "false"
    assert value_text(3) == "3" and value_text(0.25) == "0.25" and value_text(1e-5) == "1.0e-05"
    assert value_text("") == "''" and value_text("sdpa") == "sdpa"
    assert value_text("1e5") == "'1e5'"  # a string that would read back as a float is quoted
    assert value_text([]) == "[]" and value_text(["a", "b"]) == "[a, b]"
    assert value_text({"a": 1}) == "{...}"
    assert value_text(REQUIRED) == "required"


@pytest.mark.parametrize("root", [PPOConfig, RWConfig, DPOConfig], ids=lambda c: c.__name__)
def test_help_and_reference_render_the_same_records(root: type) -> None:
    gen = runpy.run_path(str(REPO / "scripts" / "gen_config_docs.py"), run_name="gen")
    help_text = format_help(root)
    reference = gen["render_reference"](root)
    for record in config_keys(root):
        if record.is_section:
            assert f"[{record.key}] {record.help}" in help_text, record.key
            assert f"# `{record.key}`" in reference, record.key
            continue
        head = f"  {record.key} ({record.type_text('|null')}, default: {record.default_text})"
        assert head + "\n" in help_text, record.key
        row = f"| `{record.key}` | {record.type_text()} | `{record.default_text}`"
        assert row in reference, record.key
