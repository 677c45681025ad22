"""Keys that did nothing are gone from the PPO config: a file or command line that sets one to
a different value is refused in one line naming what to use; the value every older
``config.yaml`` holds still loads (and is dropped); an AReaL file's ``train_dataset.type`` is
listed with its other ignored keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from areal_m2po.api.cli_args import (
    ConfigError,
    CriticConfig,
    FrozenMicroBatchSpec,
    MicroBatchSpec,
    MicroBatchSplit,
    RefConfig,
)
from areal_m2po.api.config_loader import leaf_keys, load_config
from areal_m2po.api.config_schema import config_keys
from areal_m2po.api.removed_keys import REMOVED_KEYS

REPO = Path(__file__).resolve().parents[2]


def test_removed_keys_are_no_keys() -> None:
    keys = set(leaf_keys())
    assert not keys & set(REMOVED_KEYS)
    assert {"critic.mb_spec.n_mbs", "critic.mb_spec.max_tokens_per_mb"} <= keys
    assert {"ref.mb_spec.packing", "ref.mb_spec.shared_prefix"} <= keys
    assert {"actor.mb_spec.shared_prefix_train", "actor.mb_spec.packing"} <= keys


def test_the_policys_micro_batch_keys_keep_their_order() -> None:
    keys = [r.key for r in config_keys(MicroBatchSpec) if not r.is_section]
    assert keys == [
        "n_mbs",
        "max_tokens_per_mb",
        "packing",
        "shared_prefix",
        "shared_prefix_train",
        "shared_prefix_max_tokens_per_mb",
    ]


def test_the_engines_see_what_a_critic_and_a_reference_do() -> None:
    """The engine reads the same attributes on every split: a critic's are off (a padded,
    plain value forward), a reference's never trains with shared prompts."""
    critic = CriticConfig().mb_spec
    assert type(critic) is MicroBatchSplit
    assert (critic.packing, critic.shared_prefix, critic.shared_prefix_train) == (False,) * 3
    assert critic.shared_prefix_max_tokens_per_mb is None
    ref = load_config(["ref.mb_spec.n_mbs=2"]).ref.mb_spec
    assert type(ref) is FrozenMicroBatchSpec and ref.shared_prefix_train is False
    assert RefConfig(mb_spec=ref).engine_config(load_config([]).actor).mb_spec is ref


@pytest.mark.parametrize(
    ("override", "instead"),
    [
        ("critic.mb_spec.packing=false", "actor.mb_spec keys"),
        ("critic.mb_spec.shared_prefix=false", "always padded"),
        ("critic.mb_spec.shared_prefix_train=false", "always padded"),
        ("critic.mb_spec.shared_prefix_max_tokens_per_mb=64", "always padded"),
        ("ref.mb_spec.shared_prefix_train=false", "ref.mb_spec.shared_prefix"),
        ("train_dataset.type=sft", "one kind (rl)"),
        ("valid_dataset.type=sft", "one kind (rl)"),
    ],
)
def test_a_removed_key_with_a_new_value_is_refused_in_one_line(override: str, instead: str) -> None:
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as caught:
        load_config([override])
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{key}: removed: ") and instead in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_removed_key_in_a_yaml_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("critic:\n  mb_spec:\n    packing: false\n")
    with pytest.raises(ConfigError, match=r"^critic\.mb_spec\.packing: removed: "):
        load_config(["--config", str(path)])


def test_an_older_config_yaml_still_loads(tmp_path: Path) -> None:
    """A config.yaml written before the removal holds every removed key at its old value."""
    path = tmp_path / "config.yaml"
    path.write_text(
        "train_dataset:\n  type: rl\nvalid_dataset:\n  type: rl\n"
        "critic:\n  mb_spec:\n    n_mbs: 2\n    packing: true\n    shared_prefix: true\n"
        "    shared_prefix_train: true\n    shared_prefix_max_tokens_per_mb: 1024\n"
        "ref:\n  mb_spec:\n    shared_prefix_train: true\n    packing: false\n"
    )
    cfg = load_config(["--config", str(path), "train_dataset.type=rl"])
    assert cfg.critic.mb_spec == MicroBatchSplit(n_mbs=2)
    assert cfg.ref.mb_spec == FrozenMicroBatchSpec(packing=False)
    # the run records the repository keeps load as they are
    assert load_config(["--config", str(REPO / "research" / "runs" / "main_job" / "config.yaml")])


def test_an_areal_files_dataset_type_is_listed_as_ignored() -> None:
    warnings: list[str] = []
    path = REPO / "tests" / "data" / "areal" / "examples" / "math" / "gsm8k_grpo.yaml"
    load_config(["--config", str(path)], warn=warnings.append)
    assert len(warnings) == 1 and "train_dataset.type" in warnings[0]
