"""AReaL's SFT, DPO and reward-model files (vendored from areal-project/AReaL cbff54d6 under
tests/data/areal/) read by train_sft, train_dpo and train_rm with AReaL's meaning:
every file loads or is refused in one line naming the unsupported feature, as the table of
docs/areal_parity.md says; the translated values, the one warning line, the overrides under
either name, AReaL's data layouts and min_lr_ratio's schedule."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from areal_m2po.api.cli_args import (
    DPOConfig,
    OptimizerConfig,
    RWConfig,
    RWModelConfig,
    SFTConfig,
)
from areal_m2po.api.config_loader import load_config
from areal_m2po.api.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "areal"
DOC = REPO / "docs" / "areal_parity.md"
SECTION = "## AReaL's SFT, DPO and reward-model files"
TRAINERS = {"train_sft": SFTConfig, "train_dpo": DPOConfig, "train_rm": RWConfig}

SFT = "examples/math/gsm8k_sft.yaml"
DPO = "examples/alignment/hhrlhf_dpo.yaml"
RW = "examples/alignment/hhrlhf_rw.yaml"

# file -> (trainer, None for "loads" or (culprit key, words the one line must name))
OUTCOMES: dict[str, tuple[str, tuple[str, tuple[str, ...]] | None]] = {
    SFT: ("train_sft", None),
    DPO: ("train_dpo", None),
    RW: ("train_rm", None),
    "tests/sft/config_fsdp.yaml": ("train_sft", None),
    "tests/sft/config_archon.yaml": ("train_sft", ("actor.backend", ("Archon",))),
    "tests/sft/config_megatron.yaml": ("train_sft", ("actor.backend", ("Megatron",))),
    "examples/math/gsm8k_sft_archon_fp8.yaml": ("train_sft", ("actor.backend", ("Archon", "FP8"))),
    "examples/profile/qwen3_30b_a3b_sft_profile.yaml": (
        "train_sft",
        ("actor.backend", ("Megatron", "hybrid MoE")),
    ),
    "examples/profile/qwen3_5_35b_a3b_sft_profile.yaml": (
        "train_sft",
        ("actor.backend", ("Megatron", "hybrid MoE")),
    ),
    "examples/vlm/clevr_count_70k_sft.yaml": ("train_sft", ("train_dataset.path", ("VLM",))),
}

_COMMON_IGNORED = {
    "actor.experiment_name",
    "actor.init_from_scratch",
    "actor.scheduling_spec",
    "actor.trial_name",
    "cluster.fileroot",
    "cluster.n_gpus_per_node",
    "cluster.n_nodes",
    "cluster.name_resolve.nfs_record_root",
    "cluster.name_resolve.type",
    "enable_offload",
    "scheduler.type",
    *(
        f"{s}.{k}"
        for s in ("evaluator", "saver", "stats_logger")
        for k in ("experiment_name", "trial_name", "fileroot")
    ),
    *(
        f"{d}.{k}"
        for d in ("train_dataset", "valid_dataset")
        for k in ("num_workers", "pin_memory")
    ),
}
_RECOVER_NAMES = {f"recover.{k}" for k in ("experiment_name", "trial_name", "fileroot")}


def _load(rel: str, *overrides: str, cls: type | None = None):  # noqa: ANN202 - a config
    warnings: list[str] = []
    cls = cls or TRAINERS[OUTCOMES[rel][0]]
    cfg = load_config(["--config", str(DATA / rel), *overrides], cls, warn=warnings.append)
    return cfg, warnings


def _ignored(warnings: list[str]) -> set[str]:
    (line,) = warnings
    head, _, keys = line.partition("services (docs/areal_parity.md): ")
    assert re.match(r"^AReaL config: \d+ keys ignored", head), line
    return set(keys.split(", "))


def _doc_rows() -> dict[str, tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    rows = re.findall(r"^\| `([^`]+\.yaml)` \| (train_\w+) \| (.+?) \|$", section, re.M)
    return {file: (trainer, outcome) for file, trainer, outcome in rows}


# ------------------------------------------------------------------------- every file, the doc
def test_every_vendored_file_is_in_the_table_and_the_doc():
    vendored = {p.relative_to(DATA).as_posix() for p in DATA.rglob("*.yaml")}
    text = DOC.read_text(encoding="utf-8")
    rl_table = text.split("| file at cbff54d6 | outcome | why |", 1)[1].split("\n\n", 1)[0]
    rl_files = set(re.findall(r"^\| `([^`]+\.yaml)` \|", rl_table, re.M))
    assert rl_files and not rl_files & set(OUTCOMES)
    assert vendored - rl_files == set(OUTCOMES)
    rows = _doc_rows()
    assert set(rows) == set(OUTCOMES)
    for file, (trainer, outcome) in OUTCOMES.items():
        doc_trainer, doc_outcome = rows[file]
        assert doc_trainer == trainer, file
        if outcome is None:
            assert doc_outcome.startswith("loads"), (file, doc_outcome)
        else:
            key, words = outcome
            assert doc_outcome == f"refused: `{key}` ({', '.join(words)})", (file, doc_outcome)


@pytest.mark.parametrize("rel", sorted(OUTCOMES))
def test_each_file_loads_or_is_refused_in_one_line_naming_the_feature(rel):
    trainer, outcome = OUTCOMES[rel]
    if outcome is None:
        cfg, warnings = _load(rel)
        assert isinstance(cfg, TRAINERS[trainer]) and len(warnings) == 1
        return
    key, words = outcome
    with pytest.raises(ConfigError) as info:
        _load(rel)
    assert info.value.key == key
    message = str(info.value)
    assert "\n" not in message and "unknown key" not in message
    for word in words:
        assert word.lower() in message.lower(), (word, message)


# ------------------------------------------------------------------------- translated values
def test_gsm8k_sft_has_areals_meaning():
    cfg, warnings = _load(SFT)
    model = cfg.model
    assert (model.path, model.dtype, model.gradient_checkpointing) == (
        "Qwen/Qwen3-1.7B",
        "bfloat16",
        True,
    )
    assert (model.backend, model.data_parallel_size) == ("fsdp2", 8)
    assert model.mb_spec.max_tokens_per_mb == 4096
    opt = model.optimizer
    assert (opt.type, opt.lr, opt.weight_decay, opt.beta1, opt.beta2, opt.eps) == (
        "adamw",
        2e-5,
        0.05,
        0.9,
        0.95,
        1e-5,
    )
    assert (opt.lr_scheduler_type, opt.gradient_clipping, opt.min_lr_ratio) == ("cosine", 1.0, 0.0)
    assert (cfg.seed, cfg.total_train_epochs, cfg.total_train_steps) == (1, 1, None)
    assert cfg.tokenizer_path == "Qwen/Qwen3-1.7B"  # ${actor.path} resolved
    train, valid = cfg.train_dataset, cfg.valid_dataset
    assert (train.path, train.batch_size, train.shuffle, train.split) == (
        "openai/gsm8k",
        128,
        True,
        "train",
    )
    assert valid is not None and (valid.split, valid.shuffle, valid.drop_last) == (
        "test",
        False,
        False,
    )
    for data in (train, valid):  # AReaL's gsm8k loader: question + answer + EOS, no template
        assert (data.prompt_field, data.completion_field, data.use_chat_template) == (
            "question",
            "answer",
            False,
        )
    assert (cfg.saver.freq_epochs, cfg.saver.freq_steps, cfg.saver.save_at_end) == (1, None, False)
    assert (cfg.evaluator.freq_epochs, cfg.evaluator.freq_steps) == (1, None)
    assert not cfg.evaluator.eval_at_end
    assert (cfg.recover.mode, cfg.recover.freq_secs) == ("disabled", 3600)
    assert cfg.stats_logger.wandb.mode == "disabled"
    assert _ignored(warnings) == _COMMON_IGNORED | _RECOVER_NAMES


def test_hhrlhf_dpo_has_areals_meaning():
    cfg, warnings = _load(DPO)
    assert (cfg.beta, cfg.loss_type, cfg.label_smoothing, cfg.ref_path) == (
        0.1,
        "sigmoid",
        0.0,
        None,
    )
    assert cfg.max_length == 2048
    opt = cfg.model.optimizer
    assert (opt.lr, opt.min_lr_ratio, opt.warmup_steps_proportion, opt.gradient_clipping) == (
        5e-6,
        0.1,
        0.1,
        10.0,
    )
    assert cfg.model.disable_dropout and cfg.model.data_parallel_size == 8
    assert not cfg.train_dataset.use_chat_template and cfg.train_dataset.batch_size == 64
    ref = {
        "ref.disable_dropout",
        "ref.init_from_scratch",
        "ref.mb_spec.max_tokens_per_mb",
        "ref.optimizer",
        "ref.scheduling_spec",
        "ref.scheduling_strategy.target",
        "ref.scheduling_strategy.type",
        *(f"ref.{k}" for k in ("experiment_name", "trial_name")),
    }
    assert _ignored(warnings) == _COMMON_IGNORED | _RECOVER_NAMES | ref | {
        "actor.mb_spec.granularity"
    }


def test_hhrlhf_rw_has_areals_meaning():
    cfg, warnings = _load(RW)
    model = cfg.model
    assert (model.path, model.dtype, model.disable_dropout, model.gradient_checkpointing) == (
        "Qwen/Qwen2.5-7B",
        "bfloat16",
        True,
        True,
    )
    assert (model.optimizer.lr, model.optimizer.type) == (2e-5, "adamw")
    assert cfg.train_dataset.batch_size == 256 and not cfg.train_dataset.use_chat_template
    assert cfg.valid_dataset is not None and cfg.valid_dataset.split == "test"
    recover = {f"recover.{k}" for k in ("mode", "freq_epochs", "freq_steps", "freq_secs")}
    assert _ignored(warnings) == _COMMON_IGNORED | _RECOVER_NAMES | recover | {
        "actor.mb_spec.granularity"
    }


def test_areal_engine_keys_of_memory_and_layout_go_into_the_warning_line():
    keys = (
        "actor.mb_spec.n_mbs_divisor=2",
        "actor.mb_spec.packing_algorithm=kk",
        "actor.pad_to_maximum=true",
        "actor.logprobs_chunk_size=512",
        "actor.weight_update_mode=disk",
    )
    cfg, warnings = _load(SFT, *keys, "actor.temperature=1.0")
    assert {k.split("=")[0] for k in keys} <= _ignored(warnings)
    assert cfg.model.mb_spec.max_tokens_per_mb == 4096


def test_areal_test_config_without_valid_dataset_evaluates_nothing():
    cfg, _ = _load("tests/sft/config_fsdp.yaml")
    assert cfg.valid_dataset is None and cfg.total_train_steps == 16
    assert (cfg.model.backend, cfg.model.data_parallel_size) == ("ddp", 1)


# ---------------------------------------------------------------------------------- overrides
@pytest.mark.parametrize("name", ["actor", "model"])
def test_overrides_beat_the_file_under_either_name(name):
    cfg, _ = _load(SFT, f"{name}.path=builtin:tiny", f"{name}.optimizer.lr=0.5")
    assert cfg.model.path == "builtin:tiny" and cfg.model.optimizer.lr == 0.5
    assert cfg.tokenizer_path == "builtin:tiny"  # the file's ${actor.path} follows


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        (("beta=0.3", "loss_type=ipo"), (0.3, "ipo", None)),
        (("actor.beta=0.3", "actor.loss_type=ipo"), (0.3, "ipo", None)),
        (("ref.path=/models/sft",), (0.1, "sigmoid", "/models/sft")),
        (("ref_path=/models/sft",), (0.1, "sigmoid", "/models/sft")),
    ],
)
def test_dpo_keys_under_either_name(overrides, want):
    cfg, _ = _load(DPO, *overrides)
    assert (cfg.beta, cfg.loss_type, cfg.ref_path) == want


def test_max_length_is_the_larger_dataset_limit():
    cfg, _ = _load(DPO, "valid_dataset.max_length=4096")
    assert cfg.max_length == 4096
    cfg, _ = _load(DPO, "max_length=512", "valid_dataset.max_length=256")
    assert cfg.max_length == 512


@pytest.mark.parametrize(
    ("rel", "override", "key", "words"),
    [
        (RW, "actor.is_critic=false", "actor.is_critic", "must be true for train_rm"),
        (DPO, "actor.is_critic=true", "actor.is_critic", "must be false for train_dpo"),
        (SFT, "train_dataset.type=rl", "train_dataset.type", "train_sft reads 'sft'"),
        (DPO, "valid_dataset.type=rw", "valid_dataset.type", "train_dpo reads 'dpo'"),
        (DPO, "ref.dtype=float32", "ref.dtype", "must equal actor.dtype"),
        (DPO, "ref.backend=fsdp:d4", "ref.backend", "must equal actor.backend"),
        (RW, "recover.mode=auto", "recover.mode", "train_rm writes no resumable"),
        (SFT, "actor.init_from_scratch=true", "actor.init_from_scratch", "only false"),
        (SFT, "actor.optimizer.type=adam_bf16", "actor.optimizer.type", "adam_bf16"),
        (SFT, "actor.backend=fsdp:d2t2", "actor.backend", "tensor parallelism"),
        (SFT, "actor.megatron.wrap_with_ddp=true", "actor.megatron", "Megatron"),
        (SFT, "actor.temperature=0.7", "actor.temperature", "only 1 is supported"),
    ],
)
def test_what_areal_means_and_this_trainer_cannot_do_is_one_line(rel, override, key, words):
    with pytest.raises(ConfigError) as info:
        _load(rel, override)
    assert info.value.key == key and words in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


# ------------------------------------------------------------------------------ the switches
def test_a_plain_file_is_areals_with_the_flag_or_the_switch(tmp_path):
    path = tmp_path / "plain.yaml"
    body = "actor:\n  path: builtin:tiny\n  optimizer:\n    type: adam\n    min_lr_ratio: 0.2\n"
    path.write_text(body)
    with pytest.raises(ConfigError, match="unknown key 'actor'"):
        load_config(["--config", str(path)], SFTConfig)
    cfg = load_config(["--config", str(path), "--areal-compat"], SFTConfig)
    assert cfg.model.path == "builtin:tiny" and cfg.model.optimizer.type == "adamw"
    path.write_text("areal_compat: true\n" + body)
    warnings: list[str] = []
    cfg = load_config(["--config", str(path)], RWConfig, warn=warnings.append)
    assert cfg.model.path == "builtin:tiny" and cfg.model.optimizer.min_lr_ratio == 0.2
    assert warnings == []  # nothing ignored, nothing to say
    assert cfg.valid_dataset is None and cfg.train_dataset.use_chat_template is False


def test_allocation_mode_stands_for_a_missing_actor_backend(tmp_path):
    path = tmp_path / "alloc.yaml"
    path.write_text("allocation_mode: fsdp:d2\n")
    cfg = load_config(["--config", str(path), "--areal-compat"], DPOConfig)
    assert (cfg.model.backend, cfg.model.data_parallel_size) == ("fsdp2", 2)
    path.write_text("allocation_mode: sglang:d1+fsdp:d1\n")
    with pytest.raises(ConfigError, match="^allocation_mode: .* train_dpo has none"):
        load_config(["--config", str(path), "--areal-compat"], DPOConfig)


@pytest.mark.parametrize(
    ("overrides", "want"),
    [
        (("actor.use_lora=true",), (32, 16.0, None)),
        (
            ("actor.use_lora=true", "actor.lora_rank=8", "actor.lora_alpha=4"),
            (8, 4.0, None),
        ),
        (("actor.use_lora=true", "actor.target_modules=[all-linear]"), (32, 16.0, None)),
        (("actor.use_lora=true", "actor.target_modules=[q_proj]"), (32, 16.0, ["q_proj"])),
        (("actor.use_lora=false", "actor.lora_rank=8"), None),
    ],
)
def test_areals_flat_lora_keys_are_the_lora_section(overrides, want):
    for rel in (SFT, DPO, RW):
        cfg, warnings = _load(rel, *overrides)
        lora = cfg.model.lora
        got = None if lora is None else (lora.r, lora.alpha, lora.target_modules)
        assert got == want, rel
        assert not any("lora" in key for key in _ignored(warnings))
    with pytest.raises(ConfigError, match="^actor.peft_type: 'ia3': only lora"):
        _load(SFT, "actor.use_lora=true", "actor.peft_type=ia3")


# ------------------------------------------------------------------------------- the data
def test_hhrlhf_pairs_without_prompt_share_their_start(tmp_path):
    from areal_m2po.dataset.preference import load_preference_records

    path = tmp_path / "hh.jsonl"
    head = "\n\nHuman: What is 2 plus 3?\n\nAssistant:"
    rows = [
        {"chosen": head + " It is 5.", "rejected": head + " It is 6."},
        {"chosen": "yes", "rejected": "no"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    first, second = load_preference_records(str(path))
    # the shared text up to " It is " with the cut moved before the trailing space
    assert first["prompt"] == head + " It is"
    assert (first["chosen"], first["rejected"]) == (" 5.", " 6.")
    assert (second["prompt"], second["chosen"], second["rejected"]) == ("", "yes", "no")


def test_gsm8k_record_tokens_are_areals(tmp_path, tok):
    """AReaL: ids = encode(question + answer + eos), loss after encode(question); the tiny
    model's character tokenizer has no merges across the join, so the tokens are equal."""
    from areal_m2po.dataset.sft import load_sft_records, tokenize_sft_records

    cfg, _ = _load(SFT)
    data = cfg.train_dataset
    path = tmp_path / "gsm8k.jsonl"
    row = {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"}
    path.write_text(json.dumps(row) + "\n")
    records = load_sft_records(
        str(path), prompt_field=data.prompt_field, completion_field=data.completion_field
    )
    (example,) = tokenize_sft_records(records, tok, 512, data.use_chat_template)
    seq = tok.encode(row["question"] + row["answer"] + tok.eos_token)
    prompt = tok.encode(row["question"])
    assert example["input_ids"] == seq
    assert example["loss_mask"] == [False] * len(prompt) + [True] * (len(seq) - len(prompt))


def test_reward_model_dropout_follows_disable_dropout():
    from areal_m2po.trainer.rw_trainer import _engine_config

    assert _engine_config(RWModelConfig(disable_dropout=True)).disable_dropout is True
    assert _engine_config(RWModelConfig()).disable_dropout is False


# ------------------------------------------------------------------------- min_lr_ratio
def _lrs(config: OptimizerConfig, total: int) -> list[float]:
    from areal_m2po.engine.optim import build_optimizer

    param = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = build_optimizer([param], config, total)
    out = []
    for _ in range(total + 1):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_min_lr_ratio_is_areals_cosine_floor():
    config = OptimizerConfig(lr=2.0, lr_scheduler_type="cosine", min_lr_ratio=0.1)
    lrs = _lrs(config, 4)
    # 0.1 + 0.9 * (1 + cos(pi * s / 4)) / 2 for s = 0..4, times lr 2
    want = [
        2.0,
        2 * (0.1 + 0.45 * (1 + math.sqrt(0.5))),
        1.1,
        2 * (0.1 + 0.45 * (1 - math.sqrt(0.5))),
        0.2,
    ]
    assert lrs == pytest.approx(want)
    warm = OptimizerConfig(
        lr=1.0, lr_scheduler_type="cosine", min_lr_ratio=0.2, warmup_steps_proportion=0.5
    )
    # warm-up from the floor over 2 steps: 0.2, 0.6; then the cosine over the other 2
    assert _lrs(warm, 4) == pytest.approx([0.2, 0.6, 1.0, 0.6, 0.2])


def test_min_lr_ratio_zero_is_the_plain_cosine():
    plain = _lrs(OptimizerConfig(lr=1.0, lr_scheduler_type="cosine"), 4)
    assert plain == pytest.approx(
        [1.0, 0.5 * (1 + math.sqrt(0.5)), 0.5, 0.5 * (1 - math.sqrt(0.5)), 0.0]
    )
    with pytest.raises(ConfigError, match="^min_lr_ratio"):
        OptimizerConfig(min_lr_ratio=1.5)
