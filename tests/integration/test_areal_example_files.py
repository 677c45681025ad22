"""Every RL config file of AReaL at cbff54d6 (tests/data/areal, vendored unchanged) loads or is
refused as the per-file table of docs/areal_parity.md says; the rows marked "trains" train 2
steps on builtin:tiny with only model, data and size overrides (slow).

The SFT, DPO and reward-model files are the SFT/DPO/RM trainers' (listed in ``OTHER_TRAINERS``).
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
from procs import REPO, read_metrics, subprocess_env

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.api.config_loader import load_config

AREAL = REPO / "tests" / "data" / "areal"
OTHER_TRAINERS = {
    "examples/math/gsm8k_sft.yaml",
    "examples/math/gsm8k_sft_archon_fp8.yaml",
    "examples/alignment/hhrlhf_dpo.yaml",
    "examples/alignment/hhrlhf_rw.yaml",
    "tests/sft/config_archon.yaml",
    "tests/sft/config_fsdp.yaml",
    "tests/sft/config_megatron.yaml",
    "examples/profile/qwen3_30b_a3b_sft_profile.yaml",
    "examples/profile/qwen3_5_35b_a3b_sft_profile.yaml",
    "examples/vlm/clevr_count_70k_sft.yaml",
}
"""AReaL's SFT/DPO/RM files: read by train_sft/train_dpo/train_rm, not by this table."""


def _table() -> dict[str, str]:
    """``file -> outcome`` of the per-file table in docs/areal_parity.md."""
    text = (REPO / "docs" / "areal_parity.md").read_text()
    section = text.split("| file at cbff54d6 | outcome | why |", 1)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        if not line.startswith("| `"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1]
    return rows


def _rl_files() -> list[str]:
    files = sorted(p.relative_to(AREAL).as_posix() for p in AREAL.rglob("*.yaml"))
    return [f for f in files if f not in OTHER_TRAINERS]


TABLE = _table()


def test_the_table_lists_every_vendored_rl_file_once():
    files = _rl_files()
    assert len(files) + len(OTHER_TRAINERS) == 75
    assert sorted(TABLE) == files


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_file_loads_or_is_refused_as_the_table_says(name):
    outcome = TABLE[name]
    warnings: list[str] = []
    argv = ["--config", str(AREAL / name)]
    if outcome in ("loads", "trains"):
        load_config(argv, warn=warnings.append)
        assert len(warnings) <= 1  # the one line of ignored keys
        return
    assert outcome.startswith("refused: `"), outcome
    key = outcome.split("`")[1]
    with pytest.raises(ConfigError) as err:
        load_config(argv, warn=warnings.append)
    assert err.value.key == key and "\n" not in str(err.value)
    if "sky.yaml" not in name and "environ_ref" not in name:  # the two non-configs aside
        assert "did you mean" not in str(err.value), str(err.value)


TINY = [
    "actor.path=builtin:tiny",
    "train_dataset.path=builtin:arithmetic",
    "valid_dataset.path=builtin:arithmetic",
    "valid_dataset.split=test",
    "reward.path=toy_rewards:digit_fraction",
    "train_dataset.batch_size=4",
    "valid_dataset.batch_size=4",
    "train_dataset.max_length=128",
    "gconfig.max_new_tokens=8",
    "gconfig.max_tokens=136",
    "total_train_steps=2",
    "actor.backend=fsdp:d1",
    "rollout.backend=sglang:d1",
    "num_threads=1",
]
"""The model, data and size overrides of the 2-step runs (AReaL's keys; docs/areal_parity.md)."""

SIZE_EXTRAS = {"distill": "teacher.path=builtin:tiny", "dapo": "actor.overlong_tokens=4"}
"""More model and size overrides, for the files whose name holds the key: the distillation
teacher, and DAPO's overlong-penalty window (512 tokens) inside the 8 new tokens."""


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, o in TABLE.items() if o == "trains"))
def test_the_files_marked_trains_train_two_steps_on_the_tiny_model(name, tmp_path):
    extra = [value for part, value in SIZE_EXTRAS.items() if part in name]
    cmd = [sys.executable, "-m", "areal_m2po.train", "--config", str(AREAL / name), *TINY]
    proc = subprocess.run(
        [*cmd, *extra, f"output_dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    warnings = [x for x in proc.stderr.splitlines() if x.startswith("warning: AReaL config")]
    assert len(warnings) == 1
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
    if re.search(r"^critic:", (AREAL / name).read_text(), re.M):  # its section built a critic
        assert all(math.isfinite(r["critic/value_loss"]) for r in rows)
    if "m2po" in name:
        assert [r["m2po/threshold"] for r in rows] == pytest.approx([0.04, 0.04])
    if "distill" in name:  # its teacher section built a teacher
        assert all(math.isfinite(r["distill/reverse_kl"]) for r in rows)


def test_the_sweep_script_prints_one_line_per_file(tmp_path, capsys):
    from script_loader import load_script

    sweep = load_script("scripts/areal_config_sweep.py")
    (tmp_path / "sub").mkdir()
    (tmp_path / "good.yaml").write_text("cluster:\n  n_nodes: 1\nseed: 3\n")
    (tmp_path / "sub" / "bad.yml").write_text(
        "cluster:\n  n_nodes: 1\nactor:\n  backend: 'megatron:d2'\n"
    )
    (tmp_path / "skipped.yaml").write_text("seed: [\n")
    (tmp_path / "notes.txt").write_text("not a config")
    (tmp_path / "sft.yaml").write_text("cluster:\n  n_nodes: 1\ntrain_dataset:\n  type: sft\n")
    assert sweep.main([str(tmp_path), "--skip", "skipped.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "good.yaml: (train) loads"
    assert lines[1] == "sft.yaml: (train_sft) loads"  # read by the SFT trainer, not refused
    assert lines[2].startswith(
        "sub/bad.yml: (train) error: actor.backend: 'megatron:d2': the megatron"
    )
    assert lines[3:] == ["2 of 3 load"]


def test_an_sft_dpo_or_rw_file_given_to_the_rl_trainer_names_its_entry_point():
    for rel, entry in (
        ("examples/math/gsm8k_sft.yaml", "train_sft"),
        ("examples/alignment/hhrlhf_dpo.yaml", "train_dpo"),
        ("examples/alignment/hhrlhf_rw.yaml", "train_rm"),
    ):
        with pytest.raises(ConfigError, match=f"python -m areal_m2po.{entry}$") as err:
            load_config(["--config", str(AREAL / rel)], warn=lambda _line: None)
        assert err.value.key == "train_dataset.type", rel
