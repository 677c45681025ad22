"""A user's next mistakes with a config (issue 46), each stopped in one line naming the key,
file or line, or made to work: a key given twice in a YAML file, ``~`` in a path, a
two-part path that is local, and the trainer's own advice to turn evaluation off."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from areal_m2po.api.cli_args import ConfigError, PPOConfig, RWConfig, SFTConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.trainer.preflight import check_output_path, check_paths, looks_local
from areal_m2po.trainer.run_setup import evaluation_note, no_evaluation_overrides


def test_a_key_given_twice_in_a_yaml_file_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(
        "seed: 3\nactor:\n  eps_clip: 0.3\ngconfig:\n  n_samples: 4\nactor:\n  m2_threshold: 0.05\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(["--config", str(path)])
    message = str(caught.value)
    assert message.startswith(f"config: {path}:6:1: invalid YAML: ")
    assert "duplicate key 'actor' (first at line 2)" in message and "\n" not in message


def test_a_key_given_twice_inside_a_section_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("actor:\n  eps_clip: 0.3\n  eps_clip: 0.1\n")
    with pytest.raises(ConfigError, match=r":3:3: invalid YAML: duplicate key 'eps_clip'"):
        load_config(["--config", str(path)])


def test_yaml_merge_keys_may_still_repeat_a_key(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("actor: &a\n  eps_clip: 0.3\ncritic:\n  <<: *a\n  eps_clip: 0.1\n")
    with pytest.raises(ConfigError, match="critic.eps_clip"):  # not a key: a schema error
        load_config(["--config", str(path)])


def test_a_leading_tilde_in_a_path_is_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    home = str(tmp_path)
    cfg = load_config(
        ["output_dir=~/runs/t", "actor.path=~/model", "tokenizer_path=~/tok"]
        + ["train_dataset.path=~/train.jsonl", "valid_dataset.path=~/valid.jsonl"]
        + ["ref.path=~/ref", "stats_logger.tensorboard.path=~/tb"]
    )
    assert cfg.output_dir == f"{home}/runs/t" and cfg.actor.path == f"{home}/model"
    assert cfg.tokenizer_path == f"{home}/tok" and cfg.ref.path == f"{home}/ref"
    assert cfg.train_dataset.path == f"{home}/train.jsonl"
    assert cfg.valid_dataset.path == f"{home}/valid.jsonl"
    assert cfg.stats_logger.tensorboard.path == f"{home}/tb"
    path = tmp_path / "sft.yaml"
    path.write_text("output_dir: ~/sft\nmodel:\n  path: ~/m\ntrain_dataset:\n  path: ~/d.jsonl\n")
    sft = load_config(["--config", str(path)], SFTConfig)
    assert (sft.output_dir, sft.model.path) == (f"{home}/sft", f"{home}/m")
    assert sft.train_dataset.path == f"{home}/d.jsonl"
    rw = load_config(["model.path=~/m", "train_dataset.path=~/p.jsonl"], RWConfig)
    assert (rw.model.path, rw.train_dataset.path) == (f"{home}/m", f"{home}/p.jsonl")
    assert load_config(["actor.path=a~b"]).actor.path == "a~b"  # only a leading ~


def test_output_dir_naming_a_file_stops_in_one_line(tmp_path: Path) -> None:
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    with pytest.raises(ConfigError) as caught:
        check_output_path(str(afile))
    assert str(caught.value) == f"output_dir: {afile} is a file; output_dir names the run's folder"
    with pytest.raises(ConfigError, match=r"is a file, so output_dir .* cannot be made below"):
        check_output_path(str(afile / "run"))
    check_output_path(str(tmp_path / "new" / "run"))  # a folder that can be made
    check_output_path(str(tmp_path))


@pytest.mark.parametrize(
    ("key", "detail"),
    [
        ("actor.path", "scratch/ is a folder here, so it is not taken for a hub id"),
        ("train_dataset.path", "does not exist (a .jsonl/.json/.parquet file or a `datasets`"),
    ],
)
def test_a_missing_two_part_path_beside_its_folder_is_not_a_hub_id(
    key: str, detail: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scratch").mkdir()
    assert looks_local("scratch/nope") and not looks_local("org/name")
    cfg = load_config([f"{key}=scratch/nope"])
    with pytest.raises(ConfigError) as caught:
        check_paths(cfg)
    assert caught.value.key == key and "scratch/nope does not exist" in str(caught.value)
    assert detail in str(caught.value) and "\n" not in str(caught.value)


def test_the_advice_to_evaluate_nothing_is_accepted_by_that_trainer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n')
    for cls in (PPOConfig, SFTConfig):
        cfg = load_config([f"train_dataset.path={data}"], cls)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="areal_m2po.trainer"):
            assert evaluation_note(cfg, is_main=True).startswith("eval on builtin:")
        match = re.search(r", or (.+) to evaluate nothing$", caplog.records[-1].getMessage())
        assert match is not None and match.group(1) == no_evaluation_overrides(cls)
        quiet = load_config([f"train_dataset.path={data}", *match.group(1).split()], cls)
        assert evaluation_note(quiet, is_main=True) == "no evaluation"


def test_wandb_online_without_a_key_is_one_line_before_any_model(tmp_path, monkeypatch):
    from areal_m2po.utils.stats_logger import check_wandb_login

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    online = load_config(["stats_logger.wandb.mode=online"])
    with pytest.raises(ConfigError) as caught:
        check_wandb_login(online.stats_logger.wandb)
    assert str(caught.value) == (
        "stats_logger.wandb.mode: online needs a W&B API key and none is set (WANDB_API_KEY, "
        "or `wandb login` for api.wandb.ai); use offline (upload later with `wandb sync`) or "
        "disabled"
    )
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password k\n")
    (tmp_path / "netrc").chmod(0o600)
    check_wandb_login(online.stats_logger.wandb)  # `wandb login` wrote the key
    monkeypatch.setenv("NETRC", str(tmp_path / "missing"))
    monkeypatch.setenv("WANDB_API_KEY", "k")
    check_wandb_login(online.stats_logger.wandb)
    monkeypatch.delenv("WANDB_API_KEY")
    check_wandb_login(load_config(["stats_logger.wandb.mode=offline"]).stats_logger.wandb)


def test_a_lora_adapter_folder_is_refused_as_a_model_to_train(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "org/base"}')
    cfg = load_config([f"actor.path={adapter}", "ref.path=builtin:tiny"])
    with pytest.raises(ConfigError) as caught:
        check_paths(cfg)
    assert str(caught.value) == (
        f"actor.path: {adapter} is a LoRA adapter, not a model to train: set actor.path to its "
        "base model (its adapter_config.json names it) and actor.lora to train an adapter, or "
        "merge it into the base first (peft: merge_and_unload)"
    )
    # as a frozen model (the reference) an adapter's folder is fine
    check_paths(load_config(["actor.path=builtin:tiny", f"ref.path={adapter}"]))
    sft = load_config([f"model.path={adapter}"], SFTConfig)
    with pytest.raises(ConfigError, match=r"^model\.path: .* set model\.path to its base model"):
        check_paths(sft)


@pytest.mark.parametrize("form", ["--config=~/run.yaml", "--config ~/run.yaml"])
def test_a_tilde_in_config_is_the_home_folder(tmp_path, monkeypatch, form) -> None:
    """Issue 57: docs/mistakes.md said ``~`` in ``--config`` was expanded; it was not, and
    ``--config=~/...`` is a word no shell expands."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "run.yaml").write_text("seed: 11\n")
    assert load_config(form.split(" ")).seed == 11
