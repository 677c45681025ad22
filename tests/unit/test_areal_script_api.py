"""What AReaL's scripts call before training (issue 56): load_expr_config with a user's
GRPOConfig subclass, get_custom_dataset on local copies laid out as the Hub has them, and the
runner that makes ``import areal`` the wing for one process."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from areal_m2po.areal.api.cli_args import GenerationHyperparameters, GRPOConfig, load_expr_config
from areal_m2po.areal.dataset import get_custom_dataset

REPO = Path(__file__).resolve().parents[2]
GRPO_YAML = REPO / "tests" / "data" / "areal" / "examples" / "math" / "gsm8k_grpo.yaml"


@dataclass
class MyConfig(GRPOConfig):
    """A user's config with a field of its own, as AReaL's examples write them."""

    n_turns: int = 2


def test_load_expr_config_reads_areal_yaml_into_a_user_subclass():
    argv = [
        "--config",
        str(GRPO_YAML),
        "actor.path=builtin:tiny",
        "n_turns=5",
        "actor.m2_threshold=0.04",
    ]
    config, config_file = load_expr_config(argv, MyConfig)
    assert isinstance(config, MyConfig) and config.n_turns == 5
    assert config_file == str(GRPO_YAML)
    assert isinstance(config.gconfig, GenerationHyperparameters)
    assert (config.gconfig.n_samples, config.gconfig.max_new_tokens) == (4, 1024)
    assert config.tokenizer_path == "builtin:tiny"  # ${actor.path}
    assert config.actor.m2_threshold == 0.04


def _write_parquet(path: Path, rows: list[dict]) -> None:
    import pandas as pd

    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)


@dataclass
class _DatasetSection:
    path: str
    type: str = "rl"
    max_length: int | None = None


ROWS = [{"question": "2+3=?", "answer": "5\n#### 5"}, {"question": "4+4=?", "answer": "8\n#### 8"}]


def test_gsm8k_from_a_folder_laid_out_as_the_hub(tmp_path, tok):
    _write_parquet(tmp_path / "gsm8k" / "main" / "test-00000-of-00001.parquet", ROWS)
    data = get_custom_dataset(
        split="test", dataset_config=_DatasetSection(str(tmp_path / "gsm8k")), tokenizer=tok
    )
    assert len(data) == 2
    first = data[0]
    assert first["answer"] == "5\n#### 5" and "question" not in first
    assert first["messages"] == [
        {"role": "user", "content": "2+3=?\nPlease put your final answer within \\boxed{}."}
    ]


def test_gsm8k_from_jsonl_drops_prompts_over_max_length(tmp_path, tok):
    path = tmp_path / "gsm8k_train.jsonl"
    rows = [*ROWS, {"question": "1+1=? " * 40, "answer": "2"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _DatasetSection(str(path), max_length=80)
    assert len(get_custom_dataset(split="train", dataset_config=cfg, tokenizer=tok)) == 2


def test_a_hub_id_offline_is_one_line(monkeypatch, tok):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="'openai/gsm8k' is a Hub id and this machine is offline"):
        get_custom_dataset(
            split="train", dataset_config=_DatasetSection("openai/gsm8k"), tokenizer=tok
        )


def test_an_unsupported_dataset_is_one_line(tmp_path, tok):
    with pytest.raises(ValueError, match="'hh-rlhf' with type 'rl' is not supported here"):
        get_custom_dataset(split="train", dataset_config=_DatasetSection("hh-rlhf"), tokenizer=tok)


SCRIPT = """
import sys
import areal
import areal.utils.stats_tracker as a
import areal_m2po.areal.utils.stats_tracker as b
from areal import PPOTrainer
from examples.helper import VALUE
print(areal.__name__, a is b, PPOTrainer.__module__, VALUE, sys.argv, __name__)
"""


def test_runner_maps_areal_to_the_wing_and_runs_from_the_current_folder(tmp_path):
    (tmp_path / "examples" / "sub").mkdir(parents=True)
    (tmp_path / "examples" / "__init__.py").write_text("")
    (tmp_path / "examples" / "helper.py").write_text("VALUE = 7\n")
    (tmp_path / "examples" / "sub" / "s.py").write_text(SCRIPT)
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-m", "areal_m2po.areal.run", "examples/sub/s.py", "--config", "x.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == (
        "areal_m2po.areal True areal_m2po.areal.trainer.rl_trainer 7 "
        "['examples/sub/s.py', '--config', 'x.yaml'] __main__"
    )


def test_runner_without_script_file_is_one_line(tmp_path):
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "areal_m2po.areal.run", "nope.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "error: areal_m2po.areal.run: no script 'nope.py'"


def test_runner_reports_a_bad_config_key_in_one_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import sys\nfrom areal.api.cli_args import GRPOConfig, load_expr_config\n"
        "load_expr_config(sys.argv[1:], GRPOConfig)\n"
    )
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "areal_m2po.areal.run", "train.py", "gconfig.n_samples=0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: gconfig.n_samples: must be >= 1, got 0"]


@dataclass
class _SFTSection:
    path: str
    type: str = "sft"


def test_gsm8k_sft_rows_learn_the_answer_and_eos(tmp_path, tok):
    """AReaL's gsm8k SFT row: question + answer + EOS tokenized, loss_mask 1 after the
    question's tokens (the tiny tokenizer has one token per character: counted by hand)."""
    from areal_m2po.areal.trainer.sft_trainer import to_examples

    _write_parquet(tmp_path / "gsm8k" / "main" / "train-00000-of-00001.parquet", ROWS[:1])
    (row,) = get_custom_dataset(
        split="train", dataset_config=_SFTSection(str(tmp_path / "gsm8k")), tokenizer=tok
    )
    q = tok.encode("2+3=?")
    assert row["input_ids"] == tok.encode("2+3=?5\n#### 5" + tok.eos_token)
    assert row["loss_mask"] == [0] * len(q) + [1] * (len(row["input_ids"]) - len(q))
    assert row["input_ids"][-1] == tok.eos_token_id
    (example,) = to_examples([row], "train_dataset")
    assert example["loss_mask"] == [bool(m) for m in row["loss_mask"]]
    with pytest.raises(ValueError, match="train_dataset row 0: no token with loss_mask 1"):
        to_examples([{"input_ids": [1, 2], "loss_mask": [1, 0]}], "train_dataset")


def test_hhrlhf_rows_mask_what_follows_the_shared_prompt(tmp_path, tok):
    """AReaL's hh-rlhf DPO row: each side + EOS tokenized; the loss mask starts at the first
    token where chosen and rejected differ (by hand: the shared text 'Q: x? A: ')."""
    import gzip

    from areal_m2po.areal.trainer.dpo_trainer import to_dpo_pairs

    (tmp_path / "hh-rlhf" / "helpful-base").mkdir(parents=True)
    with gzip.open(tmp_path / "hh-rlhf" / "helpful-base" / "train.jsonl.gz", "wt") as fh:
        fh.write(json.dumps({"chosen": "Q: x? A: yes", "rejected": "Q: x? A: no"}) + "\n")
    cfg = _DatasetSection(str(tmp_path / "hh-rlhf"), type="dpo")
    (row,) = get_custom_dataset(split="train", dataset_config=cfg, tokenizer=tok)
    assert row["chosen_ids"] == tok.encode("Q: x? A: yes" + tok.eos_token)
    shared = len(tok.encode("Q: x? A: "))
    assert row["chosen_loss_mask"] == [0] * shared + [1] * (len(row["chosen_ids"]) - shared)
    assert row["rejected_loss_mask"] == [0] * shared + [1] * (len(row["rejected_ids"]) - shared)
    (pair,) = to_dpo_pairs([row], "train_dataset")
    assert (
        pair["chosen"]["input_ids"] == row["chosen_ids"] and pair["where"] == "train_dataset row 0"
    )
    cfg = _DatasetSection(str(tmp_path / "hh-rlhf"), type="rw")
    (row,) = get_custom_dataset(split="train", dataset_config=cfg, tokenizer=tok)
    assert sorted(row) == ["chosen_ids", "rejected_ids"]
