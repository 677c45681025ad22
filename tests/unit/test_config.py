"""Loading the config tree: defaults < --config YAML < overrides, in every accepted form."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from areal_m2po.api import cli_args
from areal_m2po.api.cli_args import (
    ActorConfig,
    ConfigError,
    DPOConfig,
    GenerationConfig,
    NormConfig,
    PPOActorConfig,
    PPOConfig,
    PreferenceDatasetConfig,
    RefConfig,
    RejectionSamplingConfig,
    RWConfig,
    RWModelConfig,
    SFTConfig,
    SFTDatasetConfig,
    TrainEngineConfig,
)
from areal_m2po.api.config_loader import (
    config_to_yaml,
    format_help,
    leaf_keys,
    load_config,
    parse_argv,
    save_config,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))


def _write(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# ---------------------------------------------------------------------------------------------
# defaults and the three override forms
# ---------------------------------------------------------------------------------------------


def test_no_arguments_give_the_dataclass_defaults() -> None:
    cfg = load_config([])
    assert isinstance(cfg, PPOConfig)
    assert cfg == PPOConfig()
    assert cfg.actor.m2_threshold == 0.04
    assert cfg.output_dir == "outputs/m2po-arith/trial0"


def test_api_package_is_the_one_line_entry() -> None:
    """``from areal_m2po.api import ActorConfig, PPOConfig, load_config`` (README): the same
    objects as in cli_args/config_loader; cli_args itself no longer re-exports the loader (that
    re-export made cli_args and config_loader import each other)."""
    import areal_m2po.api as api
    from areal_m2po.api import config_loader

    assert api.PPOConfig is PPOConfig and api.ConfigError is ConfigError
    assert api.load_config is config_loader.load_config and api.save_config is save_config
    assert set(cli_args.__all__) < set(api.__all__)
    assert not hasattr(cli_args, "load_config")
    assert api.load_config(["actor.eps_clip=0.3"]).actor.eps_clip == 0.3


@pytest.mark.parametrize(
    "argv",
    [
        ["--actor.m2_threshold=0.05"],
        ["--actor.m2_threshold", "0.05"],
        ["actor.m2_threshold=0.05"],
    ],
    ids=["dash-equals", "dash-space", "bare"],
)
def test_three_override_forms_mean_the_same(argv: list[str]) -> None:
    cfg = load_config(argv)
    assert cfg.actor.m2_threshold == 0.05
    assert isinstance(cfg.actor.m2_threshold, float)
    assert cfg == load_config(["actor.m2_threshold=0.05"])


def test_forms_mix_and_later_overrides_win() -> None:
    cfg = load_config(["--actor.eps_clip", "0.1", "actor.eps_clip=0.3", "--seed=7", "--seed", "9"])
    assert cfg.actor.eps_clip == 0.3
    assert cfg.seed == 9


def test_negative_number_as_separate_value() -> None:
    assert load_config(["--actor.reward_bias", "-0.5"]).actor.reward_bias == -0.5


def test_nested_override() -> None:
    cfg = load_config(["--actor.optimizer.lr=3e-6", "stats_logger.wandb.mode=offline"])
    assert cfg.actor.optimizer.lr == 3e-6
    assert cfg.stats_logger.wandb.mode == "offline"


def test_key_inside_null_section_creates_it_with_defaults() -> None:
    assert load_config([]).actor.rejection_sampling is None
    cfg = load_config(["--actor.rejection_sampling.upper=5"])
    rs = cfg.actor.rejection_sampling
    assert isinstance(rs, RejectionSamplingConfig)
    assert rs == RejectionSamplingConfig(upper=5.0)
    cfg = load_config(["actor.reward_norm.mean_level=batch"])
    assert cfg.actor.reward_norm == NormConfig(mean_level="batch")


def test_null_values() -> None:
    cfg = load_config(["actor.m2_threshold=null", "actor.adv_norm=null", "total_train_steps=~"])
    assert cfg.actor.m2_threshold is None
    assert cfg.actor.adv_norm is None
    assert cfg.total_train_steps is None
    assert load_config(["actor.m2_threshold=None"]).actor.m2_threshold is None


def test_section_set_to_null_then_key_recreates_it() -> None:
    cfg = load_config(["actor.adv_norm=null", "actor.adv_norm.std_level=batch"])
    assert cfg.actor.adv_norm == NormConfig(std_level="batch")


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("false", False), ("True", True)])
def test_booleans(raw: str, value: bool) -> None:
    assert load_config([f"actor.use_decoupled_loss={raw}"]).actor.use_decoupled_loss is value


def test_lists() -> None:
    cfg = load_config(["gconfig.stop=[a,b]"])
    assert cfg.gconfig.stop == ["a", "b"]
    cfg = load_config(["--gconfig.stop", '["</s>", "\\n\\n"]'])
    assert cfg.gconfig.stop == ["</s>", "\n\n"]
    cfg = load_config(["stats_logger.wandb.tags=[x, 2]"])
    assert cfg.stats_logger.wandb.tags == ["x", "2"]


def test_mapping_value_merges_into_section() -> None:
    cfg = load_config(["actor.adv_norm={mean_level: batch, std_level: null}"])
    assert cfg.actor.adv_norm == NormConfig(mean_level="batch", std_level=None)


def test_string_fields_take_text_verbatim() -> None:
    cfg = load_config(["trial_name=007", "experiment_name=on", "output_dir=/tmp/x: y"])
    assert cfg.trial_name == "007"
    assert cfg.experiment_name == "on"
    assert cfg.output_dir == "/tmp/x: y"


def test_ints_accepted_for_floats_and_exponents_are_floats() -> None:
    cfg = load_config(["actor.eps_clip=1", "actor.optimizer.lr=1e-5", "actor.reward_clip=2E1"])
    assert cfg.actor.eps_clip == 1.0 and isinstance(cfg.actor.eps_clip, float)
    assert cfg.actor.optimizer.lr == 1e-5
    assert cfg.actor.reward_clip == 20.0


def test_output_dir_follows_names_when_not_set() -> None:
    cfg = load_config(["experiment_name=exp", "trial_name=t1"])
    assert cfg.output_dir == "outputs/exp/t1"


def test_parse_argv_splits_files_and_overrides() -> None:
    files, overrides = parse_argv(["--config", "a.yaml", "x=1", "--config=b.yaml", "--y", "2"])
    assert files == ["a.yaml", "b.yaml"]
    assert overrides == [("x", "1"), ("y", "2")]


# ---------------------------------------------------------------------------------------------
# YAML files
# ---------------------------------------------------------------------------------------------


def test_partial_yaml_keeps_other_defaults(tmp_path: Path) -> None:
    path = _write(tmp_path, "actor:\n  eps_clip: 0.3\ngconfig:\n  n_samples: 4\n")
    cfg = load_config(["--config", path])
    assert cfg.actor.eps_clip == 0.3
    assert cfg.gconfig.n_samples == 4
    expected = PPOConfig()
    assert cfg.actor.m2_threshold == expected.actor.m2_threshold
    assert cfg.actor.optimizer == expected.actor.optimizer
    assert cfg.train_dataset == expected.train_dataset


def test_yaml_then_overrides_win(tmp_path: Path) -> None:
    path = _write(tmp_path, "actor:\n  eps_clip: 0.3\n  m2_threshold: 0.1\n")
    cfg = load_config(["actor.eps_clip=0.25", "--config", path])
    assert cfg.actor.eps_clip == 0.25
    assert cfg.actor.m2_threshold == 0.1


def test_yaml_interpolation(tmp_path: Path) -> None:
    text = (
        "experiment_name: interp\n"
        "output_dir: /tmp/runs/${experiment_name}\n"
        "gconfig:\n  n_samples: 4\n"
        "actor:\n  adv_norm:\n    group_size: ${gconfig.n_samples}\n"
        "  temperature: ${gconfig.temperature}\n"
    )
    cfg = load_config(["--config", _write(tmp_path, text)])
    assert cfg.output_dir == "/tmp/runs/interp"
    assert cfg.actor.adv_norm.group_size == 4
    # interpolation sees the final values, overrides included
    cfg = load_config(["--config", _write(tmp_path, text), "gconfig.n_samples=2"])
    assert cfg.actor.adv_norm.group_size == 2


def test_interpolation_in_override() -> None:
    cfg = load_config(["gconfig.max_new_tokens=${gconfig.n_samples}"])
    assert cfg.gconfig.max_new_tokens == cfg.gconfig.n_samples == 8


def test_yaml_null_section_and_nested_creation(tmp_path: Path) -> None:
    text = "actor:\n  adv_norm: null\n  rejection_sampling:\n    upper: 3.0\n"
    cfg = load_config(["--config", _write(tmp_path, text)])
    assert cfg.actor.adv_norm is None
    assert cfg.actor.rejection_sampling == RejectionSamplingConfig(upper=3.0)


def test_yaml_12_scalars(tmp_path: Path) -> None:
    text = "actor:\n  optimizer:\n    lr: 3e-6\nstats_logger:\n  wandb:\n    project: on\n"
    cfg = load_config(["--config", _write(tmp_path, text)])
    assert cfg.actor.optimizer.lr == 3e-6
    assert cfg.stats_logger.wandb.project == "on"


def test_empty_yaml_is_the_defaults(tmp_path: Path) -> None:
    assert load_config(["--config", _write(tmp_path, "# nothing\n")]) == PPOConfig()


def test_several_config_files_merge_in_order(tmp_path: Path) -> None:
    a = _write(tmp_path, "seed: 3\nactor:\n  eps_clip: 0.3\n", "a.yaml")
    b = _write(tmp_path, "seed: 4\n", "b.yaml")
    cfg = load_config(["--config", a, "--config", b])
    assert (cfg.seed, cfg.actor.eps_clip) == (4, 0.3)


# ---------------------------------------------------------------------------------------------
# errors raised by load_config (the CLI table is in test_cli.py)
# ---------------------------------------------------------------------------------------------


def test_unknown_key_suggests_nearest() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["actor.m2_treshold=0.05"])
    assert info.value.key == "actor.m2_treshold"
    assert str(info.value) == (
        "actor.m2_treshold: unknown key 'actor.m2_treshold' (did you mean 'actor.m2_threshold'?)"
    )


def test_wrong_type_message() -> None:
    with pytest.raises(ConfigError, match=r"^actor\.eps_clip: expected float, got 'abc'$"):
        load_config(["actor.eps_clip=abc"])


def test_validation_error_is_prefixed_with_section() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["actor.optimizer.lr=-1"])
    assert info.value.key == "actor.optimizer.lr"


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        load_config(["gconfig.n_samples=0"])


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "seed: 1\nactor:\n  eps_clip: [0.2\n  lr: 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(["--config", path])
    assert info.value.key == "config"
    assert f"{path}:" in str(info.value)
    assert "\n" not in str(info.value)


def test_yaml_unknown_nested_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "actor:\n  optimizer:\n    lrr: 0.1\n")
    with pytest.raises(ConfigError, match=r"did you mean 'actor\.optimizer\.lr'"):
        load_config(["--config", path])


# ---------------------------------------------------------------------------------------------
# Python construction
# ---------------------------------------------------------------------------------------------


def test_python_construction() -> None:
    actor = ActorConfig(m2_threshold=0.05, eps_clip=0.2, use_sapo_loss=False)
    assert actor.m2_threshold == 0.05
    assert PPOActorConfig is ActorConfig
    cfg = PPOConfig(actor=actor, gconfig=GenerationConfig(n_samples=4))
    assert cfg.actor.m2_threshold == 0.05
    assert load_config(["actor.m2_threshold=0.05"]).actor == dataclasses.replace(
        PPOConfig().actor, m2_threshold=0.05
    )


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"m2_threshold": 0.0}, "m2_threshold"),
        ({"eps_clip": -0.1}, "eps_clip"),
        ({"c_clip": 1.0}, "c_clip"),
        ({"sapo_tau_neg": 0.0}, "sapo_tau_neg"),
        ({"use_sapo_loss": True, "use_decoupled_loss": True}, "use_sapo_loss"),
        ({"eps_clip": "0.2"}, "eps_clip"),
    ],
)
def test_python_construction_validates(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError) as info:
        ActorConfig(**kwargs)
    assert isinstance(info.value, ConfigError)
    assert info.value.key == key


@pytest.mark.parametrize(
    "root", [PPOConfig, RWConfig, SFTConfig, DPOConfig], ids=lambda c: c.__name__
)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"experiment_name": ""}, "experiment_name: must not be empty"),
        ({"trial_name": 7}, "trial_name: must be a string, got 7"),
        ({"seed": -1}, "seed: must be >= 0, got -1"),
        (
            {"output_dir": ""},
            "output_dir: must not be empty (null derives it from the names)",
        ),
        ({"total_train_epochs": 0}, "total_train_epochs: must be >= 1, got 0"),
        ({"total_train_steps": 1.5}, "total_train_steps: must be an integer, got 1.5"),
        ({"num_threads": 0}, "num_threads: must be >= 1, got 0"),
        ({"tokenizer_path": 3}, "tokenizer_path: must be a string, got 3"),
    ],
)
def test_both_roots_check_the_run_keys_alike(root: type, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        root(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize("root", [PPOConfig, RWConfig, DPOConfig], ids=lambda c: c.__name__)
def test_both_roots_derive_output_dir_from_the_names(root: type) -> None:
    assert root(experiment_name="e", trial_name="t").output_dir == "outputs/e/t"
    assert root(experiment_name="e", output_dir="out").output_dir == "out"


@pytest.mark.parametrize(
    ("root", "kwargs", "message"),
    [
        (PPOConfig, {"actor": 1}, "actor: must be a ActorConfig section, got 1"),
        (PPOConfig, {"valid_dataset": None}, "valid_dataset: must be a DatasetConfig section"),
        (RWConfig, {"model": TrainEngineConfig()}, "model: must be a RWModelConfig section"),
        (SFTConfig, {"model": RWModelConfig()}, "model: must be a TrainEngineConfig section"),
        (SFTConfig, {"valid_dataset": 2}, "valid_dataset: must be a SFTDatasetConfig section"),
        # required sections are checked before the nullable ones, whatever the field order
        (RWConfig, {"valid_dataset": 1, "evaluator": 2}, "evaluator: must be a EvaluatorConfig"),
        (SFTConfig, {"valid_dataset": 1, "recover": 2}, "recover: must be a RecoverConfig"),
        (DPOConfig, {"model": RWModelConfig()}, "model: must be a TrainEngineConfig section"),
        (DPOConfig, {"valid_dataset": 3}, "valid_dataset: must be a PreferenceDatasetConfig"),
    ],
)
def test_roots_check_their_sections(root: type, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        root(**kwargs)
    assert str(info.value).startswith(message)


@pytest.mark.parametrize("root", [RWConfig, SFTConfig, DPOConfig], ids=lambda c: c.__name__)
def test_nullable_sections_accept_null(root: type) -> None:
    assert root(valid_dataset=None).valid_dataset is None


@pytest.mark.parametrize(
    "model", [TrainEngineConfig, ActorConfig, RWModelConfig], ids=lambda c: c.__name__
)
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"path": ""}, "path: must not be empty"),
        ({"path": None}, "path: must be a string, got None"),
        ({"dtype": "fp8"}, "dtype: must be one of ['float32', 'bfloat16', 'float16'], got 'fp8'"),
        ({"gradient_checkpointing": 1}, "gradient_checkpointing: must be true or false, got 1"),
        ({"lora": {"r": 4}}, "lora: must be a LoRAConfig section, got {'r': 4}"),
        ({"optimizer": None}, "optimizer: must be a OptimizerConfig section, got None"),
    ],
)
def test_trained_model_sections_check_their_keys_alike(
    model: type, kwargs: dict, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        model(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (RefConfig, "path: must not be empty (null means actor.path)"),
        (PreferenceDatasetConfig, "path: must not be empty"),
        (SFTDatasetConfig, "path: must not be empty"),
    ],
)
def test_empty_paths_are_refused(section: type, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        section(path="")
    assert str(info.value) == message


def test_python_cross_section_check() -> None:
    with pytest.raises(ConfigError) as info:
        PPOConfig(gconfig=GenerationConfig(temperature=0.5))
    assert info.value.key == "actor.temperature"


# ---------------------------------------------------------------------------------------------
# printing, saving, help
# ---------------------------------------------------------------------------------------------


def test_yaml_round_trip_is_identical(tmp_path: Path) -> None:
    cfg = load_config(
        [
            "actor.rejection_sampling.upper=5",
            "gconfig.stop=[a, '1e5', 'on']",
            "trial_name=007",
            "actor.optimizer.lr=1e-6",
        ]
    )
    text = config_to_yaml(cfg)
    path = _write(tmp_path, text)
    again = load_config(["--config", path])
    assert again == cfg
    assert config_to_yaml(again) == text
    assert list(yaml.safe_load(text)) == [f.name for f in dataclasses.fields(PPOConfig)]


def test_save_config(tmp_path: Path) -> None:
    cfg = load_config(["seed=5"])
    path = save_config(cfg, tmp_path / "run" / "config.yaml")
    assert path.read_text(encoding="utf-8") == config_to_yaml(cfg)
    assert load_config(["--config", str(path)]) == cfg
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]


def test_help_lists_every_leaf_field_with_type_default_and_help() -> None:
    text = format_help(PPOConfig)
    keys = leaf_keys(PPOConfig)
    assert len(keys) > 100
    for key in keys:
        assert f"  {key} (" in text, key
    assert "  actor.m2_threshold (float|null, default: 0.04)" in text
    assert "  actor.rejection_sampling.upper (float|null, default: 5.0)" in text
    flat = " ".join(text.split())
    assert "Choices: global, microbatch." in flat
    assert "M2PO: mask the tokens with the largest (behave_logp - prox_logp)^2" in flat


# ---------------------------------------------------------------------------------------------
# shipped config files
# ---------------------------------------------------------------------------------------------


def test_expected_config_files_exist() -> None:
    names = {p.name for p in CONFIG_FILES}
    assert {
        "default.yaml",
        "tiny.yaml",
        "gsm8k_m2po.yaml",
        "grpo_baseline.yaml",
        "sapo_m2po.yaml",
        "m2po_stale.yaml",
    } <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_file_loads_validates_and_round_trips(path: Path, tmp_path: Path) -> None:
    cfg = load_config(["--config", str(path)])
    assert isinstance(cfg, PPOConfig)
    text = config_to_yaml(cfg)
    assert config_to_yaml(load_config(["--config", _write(tmp_path, text)])) == text


def test_default_yaml_is_the_builtin_default() -> None:
    assert load_config(["--config", str(CONFIGS / "default.yaml")]) == load_config([])


def test_tiny_yaml() -> None:
    cfg = load_config(["--config", str(CONFIGS / "tiny.yaml")])
    assert cfg.actor.path == "builtin:tiny" and cfg.ref.path == "builtin:tiny"
    assert cfg.train_dataset.path == "builtin:arithmetic"
    assert (cfg.train_dataset.batch_size, cfg.gconfig.n_samples) == (4, 4)
    assert cfg.gconfig.max_new_tokens == 8
    assert cfg.total_train_steps == 3
    assert cfg.valid_dataset.max_samples == 16
    assert cfg.output_dir == "outputs/tiny/trial0"


def test_gsm8k_m2po_yaml_carries_areal_intent() -> None:
    cfg = load_config(["--config", str(CONFIGS / "gsm8k_m2po.yaml")])
    actor = cfg.actor
    assert actor.m2_threshold == 0.04
    assert actor.use_decoupled_loss and actor.recompute_logprob
    assert cfg.rollout.max_head_offpolicyness == 2
    assert cfg.gconfig.n_samples == 4
    assert actor.reward_norm is not None and actor.reward_norm.group_size == 4
    assert actor.rejection_sampling is not None and actor.rejection_sampling.upper == 5.0
    assert cfg.train_dataset.path.endswith(".jsonl")
    assert cfg.tokenizer_path == actor.path


def test_grpo_baseline_and_sapo_yaml() -> None:
    grpo = load_config(["--config", str(CONFIGS / "grpo_baseline.yaml")])
    assert grpo.actor.m2_threshold is None
    sapo = load_config(["--config", str(CONFIGS / "sapo_m2po.yaml")])
    assert sapo.actor.use_sapo_loss and sapo.actor.m2_threshold is not None
    assert not sapo.actor.use_decoupled_loss
    # the gate needs a ratio that can leave 1: more than one optimizer step per batch
    assert sapo.actor.ppo_n_minibatches > 1


def test_grpo_baseline_is_the_study_grpo_arm() -> None:
    """The shipped clipped-GRPO baseline sets the loss keys of the stale-data study's GRPO arm
    (research/stale_study/arms.yaml), the demo's defaults for everything else."""
    import yaml

    arms = yaml.safe_load((CONFIGS.parent / "research" / "stale_study" / "arms.yaml").read_text())
    overrides = [
        f"{k}={'null' if v is None else v}" for k, v in arms["arms"]["grpo"]["overrides"].items()
    ]
    grpo = load_config(["--config", str(CONFIGS / "grpo_baseline.yaml")])
    arm = load_config([f"experiment_name={grpo.experiment_name}", *overrides])
    assert grpo == arm
    assert not grpo.actor.recompute_logprob and grpo.actor.eps_clip == 0.2


def test_m2po_stale_yaml_is_the_demo_four_versions_stale() -> None:
    stale = load_config(["--config", str(CONFIGS / "m2po_stale.yaml")])
    demo = load_config(["experiment_name=m2po-stale", "rollout.staleness=4"])
    assert stale == demo


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.0}, "beta: must be > 0, got 0.0"),
        ({"beta": -0.1}, "beta: must be > 0, got -0.1"),
        ({"beta": float("inf")}, "beta: must be finite, got inf"),
        ({"label_smoothing": 0.5}, "label_smoothing: must be < 0.5, got 0.5"),
        ({"label_smoothing": -0.01}, "label_smoothing: must be >= 0, got -0.01"),
        ({"loss_type": "hinge"}, "loss_type: must be one of ['sigmoid', 'ipo'], got 'hinge'"),
        (
            {"loss_type": "ipo", "label_smoothing": 0.1},
            "label_smoothing: must be 0 with loss_type=ipo (got 0.1); label smoothing is a "
            "sigmoid-loss option",
        ),
        ({"ref_path": ""}, "ref_path: must not be empty (null means the start model)"),
        ({"max_length": 1}, "max_length: must be >= 2, got 1"),
    ],
)
def test_dpo_config_checks(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        DPOConfig(**kwargs)
    assert str(info.value) == message


def test_dpo_config_requires_its_training_pairs_at_run_time() -> None:
    cfg = DPOConfig()  # --help and --print-config work without a dataset
    with pytest.raises(ConfigError, match="train_dataset.path: must be set"):
        cfg.check_required()
    cfg = DPOConfig(
        train_dataset=PreferenceDatasetConfig(path="t.jsonl"),
        valid_dataset=PreferenceDatasetConfig(),
    )
    with pytest.raises(ConfigError, match="valid_dataset.path: must be set when valid_dataset"):
        cfg.check_required()
    assert DPOConfig(loss_type="ipo").label_smoothing == 0.0
