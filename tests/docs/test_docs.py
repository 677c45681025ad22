"""The documentation stays true to the code.

* docs/configuration.md's reference is what scripts/gen_config_docs.py generates from the
  dataclass metadata now (regenerate with ``python scripts/gen_config_docs.py``), and names
  every leaf key.
* docs/m2po.md names every M2PO diagnostic the actor logs and describes the masked-fraction
  warning as the actor implements it.
* docs/scaling.md's Accelerate config files are valid Accelerate configs.
* Relative links in the docs and the README point at files that exist.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import runpy
import typing
from pathlib import Path

import pytest
import torch

from areal_m2po.api.cli_args import ActorConfig, PPOConfig
from areal_m2po.api.config_loader import leaf_keys

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"


@pytest.fixture(scope="module")
def gen():
    return runpy.run_path(str(REPO / "scripts" / "gen_config_docs.py"), run_name="gen_config_docs")


# ---------------------------------------------------------------------------------------------
# docs/configuration.md
# ---------------------------------------------------------------------------------------------


def test_configuration_reference_is_up_to_date(gen):
    current = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert gen["splice"](current, gen["render_reference"]()) == current, (
        "docs/configuration.md is stale: run python scripts/gen_config_docs.py"
    )
    assert gen["main"](["--check"]) == 0


def test_configuration_reference_lists_every_leaf_key_with_its_default(gen):
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    reference = text.split(gen["BEGIN"], 1)[1].split(gen["END"], 1)[0]
    rows = {}
    for line in reference.splitlines():
        m = re.match(r"^\| `([^`]+)` \| ([^|]+) \| `([^`]*)`", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3))
    keys = leaf_keys(PPOConfig)
    missing = [k for k in keys if k not in rows]
    assert not missing, f"not in docs/configuration.md: {missing}"
    assert set(rows) == set(keys), f"documented keys that do not exist: {set(rows) - set(keys)}"
    # spot checks of the rendered defaults against the live config
    cfg = PPOConfig()
    assert rows["actor.m2_threshold"] == ("float or null", str(cfg.actor.m2_threshold))
    assert rows["actor.m2_warn_masked_fraction"][1] == str(cfg.actor.m2_warn_masked_fraction)
    assert rows["rollout.staleness"] == ("int", str(cfg.rollout.staleness))
    assert rows["valid_dataset.batch_size"][1] == str(cfg.valid_dataset.batch_size)
    assert rows["gconfig.stop"] == ("list of str or null", "null")


def test_configuration_reference_has_a_section_per_dataclass_field():
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")

    def section_class(annotation: typing.Any) -> type | None:
        """The dataclass a field holds (``X`` or ``X | None``), or None for a leaf."""
        inner = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        return inner[0] if len(inner) == 1 and dataclasses.is_dataclass(inner[0]) else None

    def sections(cls: type, prefix: str = "") -> list[str]:
        out = []
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            inner = section_class(hints[f.name])
            if inner is not None:
                out.append(prefix + f.name)
                out += sections(inner, prefix + f.name + ".")
        return out

    for key in sections(PPOConfig):
        assert f"### `{key}`" in text, key


def test_gen_config_docs_rewrites_a_stale_copy(gen, tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(f"# intro\n\n{gen['BEGIN']}\nold text\n{gen['END']}\n\n# outro\n")
    assert gen["main"](["--check", "--path", str(stale)]) == 1
    assert gen["main"](["--path", str(stale)]) == 0
    text = stale.read_text()
    assert text.startswith("# intro\n") and text.endswith("\n# outro\n")
    assert "old text" not in text and "`actor.m2_threshold`" in text
    assert gen["main"](["--check", "--path", str(stale)]) == 0


# ---------------------------------------------------------------------------------------------
# docs/m2po.md
# ---------------------------------------------------------------------------------------------


def test_m2po_doc_names_every_logged_diagnostic():
    from areal_m2po.trainer.ppo.actor import global_m2po_mask

    text = (DOCS / "m2po.md").read_text(encoding="utf-8")
    logp = torch.zeros(2, 3)
    mb = {
        "behave_logp": logp,
        "prox_logp": logp + 0.5,
        "loss_mask": torch.ones(2, 3, dtype=torch.bool),
    }
    _, stats = global_m2po_mask(mb, 0.04)
    assert stats, "no diagnostics?"
    for key in stats:
        assert f"`{key}`" in text, key
    for key in ("actor.m2_threshold", "actor.m2_scope", "actor.m2_warn_masked_fraction"):
        assert f"`{key}`" in text, key


def test_m2po_doc_states_the_warning_as_implemented(caplog):
    from areal_m2po.trainer.ppo.actor import PPOActor

    text = (DOCS / "m2po.md").read_text(encoding="utf-8")
    level = ActorConfig().m2_warn_masked_fraction
    assert level == 0.2 and "default **0.2**" in text and "**3 steps in" in text
    actor = PPOActor(ActorConfig(m2_threshold=0.04), engine=None, group_size=4, max_new_tokens=8)

    def warnings_after(fractions: list[float]) -> list[int]:
        """Indices of the steps (0-based) after which a 'steps in a row' warning was logged."""
        hits = []
        for i, frac in enumerate(fractions):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="areal_m2po.actor"):
                actor._check_masked_fraction({"m2po/masked_fraction": frac})
            if any("3 steps in a row" in r.getMessage() for r in caplog.records):
                hits.append(i)
        return hits

    # above the level three times in a row: one warning, on the third step, not repeated
    assert warnings_after([0.3, 0.3, 0.3, 0.3, 0.3]) == [2]
    # at the level does not count and restarts the streak; a new streak of 3 warns again
    assert warnings_after([0.2, 0.3, 0.3, 0.2, 0.3, 0.3, 0.3]) == [6]
    # 90% or more: an immediate warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="areal_m2po.actor"):
        actor._check_masked_fraction({"m2po/masked_fraction": 0.95})
    assert any("raise it" in r.getMessage() for r in caplog.records)


def test_m2po_doc_quotes_the_trust_region_warnings():
    """docs/m2po.md's "Which loss terms act" shows the start-up lines as the trainer writes them."""
    from areal_m2po.trainer.ppo.trust_region import trust_region_warnings

    text = (DOCS / "m2po.md").read_text(encoding="utf-8")
    uncorrected = ActorConfig(recompute_logprob=True, use_decoupled_loss=False, m2_threshold=0.04)
    decoupled = ActorConfig(recompute_logprob=True, use_decoupled_loss=True, m2_threshold=0.04)
    for actor in (uncorrected, decoupled):
        (line,) = trust_region_warnings(actor, 1)
        assert f"\n{line}\n" in text, line


def test_m2po_doc_threshold_advice_matches_defaults():
    text = (DOCS / "m2po.md").read_text(encoding="utf-8")
    assert PPOConfig().actor.m2_threshold == 0.04
    assert "**0.04**" in text and "**0.01 to 0.1**" in text
    assert "`m2po/masked_fraction`" in text


# ---------------------------------------------------------------------------------------------
# docs/scaling.md and the Accelerate configs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [("ddp", "MULTI_GPU"), ("fsdp", "MULTI_GPU"), ("deepspeed_zero2", "DEEPSPEED")],
)
def test_accelerate_config_files_are_valid(name, kind):
    from accelerate.commands.config.config_args import ClusterConfig

    path = REPO / "configs" / "accelerate" / f"{name}.yaml"
    cfg = ClusterConfig.from_yaml_file(str(path))  # raises on keys Accelerate does not know
    assert str(cfg.distributed_type).endswith(kind)
    assert f"configs/accelerate/{name}.yaml" in (DOCS / "scaling.md").read_text(encoding="utf-8")


def test_scaling_doc_commands():
    text = (DOCS / "scaling.md").read_text(encoding="utf-8")
    assert (
        "accelerate launch --multi_gpu --num_processes 2 -m areal_m2po.train "
        "--config configs/tiny.yaml" in text
    )
    for flag in ("--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port"):
        assert flag in text, flag
    assert (REPO / "configs" / "tiny.yaml").exists()


# ---------------------------------------------------------------------------------------------
# links
# ---------------------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


_DOCS_MD = sorted(p.relative_to(REPO).as_posix() for p in DOCS.rglob("*.md"))
_RESEARCH_MD = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "research").rglob("*.md"))


@pytest.mark.parametrize("doc", ["README.md", *_DOCS_MD, *_RESEARCH_MD])
def test_relative_links_resolve(doc):
    path = REPO / doc
    for target in _LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+://", target) or target.startswith(("#", "mailto:")):
            continue
        file = target.split("#", 1)[0]
        assert (path.parent / file).exists(), f"{doc}: broken link {target}"


def test_docs_hold_pages_and_the_figures_they_show():
    """docs/ is the product's pages and the figures they show; run artefacts (metrics, configs,
    CSVs, run folders) live under research/runs/."""
    pages = "\n".join((DOCS / name).read_text(encoding="utf-8") for name in _docs_pages())
    for path in sorted(p for p in DOCS.rglob("*") if p.is_file()):
        rel = path.relative_to(DOCS).as_posix()
        if path.suffix == ".md":
            assert "/" not in rel, f"docs/{rel}: pages sit at the top of docs/"
            continue
        assert rel.startswith("figures/") and path.suffix == ".png", f"docs/{rel}: a run artefact"
        assert f"]({rel})" in pages, f"docs/{rel}: no page shows it"


def _docs_pages() -> list[str]:
    return sorted(p.name for p in DOCS.glob("*.md"))


def test_readme_links_the_docs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for name in ("m2po.md", "configuration.md", "scaling.md"):
        assert f"(docs/{name})" in readme, name


def _readme_train_commands() -> list[list[str]]:
    """The argument lists of every ``python -m areal_m2po.train`` command in README bash blocks."""
    import shlex

    text = (REPO / "README.md").read_text(encoding="utf-8")
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("&&")[-1].strip()
            prefix = "python -m areal_m2po.train"
            if line.startswith(prefix):
                commands.append(shlex.split(line[len(prefix) :]))
    return commands


def test_readme_train_commands_are_valid_configs(monkeypatch):
    """Every training command the README shows loads as a valid config (files it names exist)."""
    from areal_m2po.api.config_loader import load_config

    monkeypatch.chdir(REPO)  # the README's paths are relative to the repository root
    commands = _readme_train_commands()
    assert any("rollout.staleness=4" in args for args in commands)  # the M2PO-firing command
    checked = 0
    for args in commands:
        if "--config" in args and not (REPO / args[args.index("--config") + 1]).exists():
            continue  # a file the reader writes first (my_run.yaml)
        load_config(args)
        checked += 1
    assert checked >= 5


def test_rollout_doc_tree_names_every_rollout_module():
    """docs/rollout.md's tree of rollout/ names every module there is, and no other."""
    text = (DOCS / "rollout.md").read_text()
    block = text.split("## Where the code is", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"\b(\w+\.py)\b", block)) - {"__init__.py"}
    root = REPO / "areal_m2po" / "rollout"
    files = {p.name for p in root.rglob("*.py") if p.name != "__init__.py"}
    assert named == files
