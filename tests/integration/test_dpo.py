"""DPO (python -m areal_m2po.train_dpo) on the tiny model: the pair rows and their loss masks,
one engine step against a hand computation of the DPO loss for any micro-batch split, bad
pairs and bad configs as one line before any model loads, a run that raises the held-out
preference accuracy (sigmoid, IPO, LoRA), another reference model, the CLI and Python entries,
and exact resume after SIGKILL."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from procs import REPO, SUPPORT, read_metrics, subprocess_env, untimed

from areal_m2po.api.cli_args import (
    DPOConfig,
    EvaluatorConfig,
    LoRAConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PreferenceDatasetConfig,
    RecoverConfig,
    SaverConfig,
    StatsLoggerConfig,
    TrainEngineConfig,
)
from areal_m2po.dataset.dpo import collate_dpo, tokenize_dpo_pairs
from areal_m2po.dataset.preference import load_preference_records
from areal_m2po.utils import recover

pytestmark = pytest.mark.usefixtures("restore_threads")


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _separable_pairs(n: int, seed: int) -> list[dict[str, str]]:
    """The chosen answer ends in ' yes', the rejected in ' no'."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {"prompt": f"What is {a} + {b}?", "chosen": f"{a + b} yes", "rejected": f"{a + b} no"}
        )
    return rows


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("dpo_data")
    return (
        _write_jsonl(root / "train.jsonl", _separable_pairs(32, seed=0)),
        _write_jsonl(root / "valid.jsonl", _separable_pairs(16, seed=1)),
    )


# ------------------------------------------------------------------------------- tokenization
def test_string_pair_rows_learn_only_the_completion(tok):
    record = {"prompt": "What is 1 + 2?", "chosen": "3", "rejected": "4 no", "where": "p"}
    (pair,) = tokenize_dpo_pairs([record], tok, 256)
    for name in ("chosen", "rejected"):
        ids, mask = pair[name]["input_ids"], pair[name]["loss_mask"]
        learned = tok.decode([i for i, m in zip(ids, mask) if m])
        assert learned == record[name] + "<|im_end|>\n"
    batch = collate_dpo([pair, pair], tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 4
    first = [row.nonzero()[0].item() for row in batch["loss_mask"]]
    assert len(set(first)) == 1  # the first completion token in one column
    assert torch.equal(batch["loss_mask"][0], batch["loss_mask"][2])  # rows 0, 2: chosen


def test_conversational_pair_learns_only_the_completion_turns(tok, tmp_path):
    """The prompt's own assistant turn is context; the completion's assistant turn is
    learned; a string completion after a conversational prompt is one assistant turn."""
    prompt = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
    ]
    rows = [
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "4"}], "rejected": "5"},
    ]
    path = _write_jsonl(tmp_path / "conv.jsonl", rows)
    records = load_preference_records(str(path), conversational=True)
    (pair,) = tokenize_dpo_pairs(records, tok, 256)
    for name, text in (("chosen", "4"), ("rejected", "5")):
        ids, mask = pair[name]["input_ids"], pair[name]["loss_mask"]
        assert tok.decode([i for i, m in zip(ids, mask) if m]) == text + "<|im_end|>\n"
        turns = prompt + [{"role": "assistant", "content": text}]
        assert tok.decode(ids) == tok.apply_chat_template(turns, tokenize=False)


def test_implicit_prompt_is_the_turns_both_conversations_share(tok, tmp_path):
    """TRL's implicit-prompt format: two whole conversations, no 'prompt'."""
    user = {"role": "user", "content": "1+1?"}
    rows = [
        {
            "chosen": [user, {"role": "assistant", "content": "2"}],
            "rejected": [user, {"role": "assistant", "content": "3"}],
        },
        {"chosen": [{"role": "assistant", "content": "2"}], "rejected": [user]},
    ]
    path = _write_jsonl(tmp_path / "implicit.jsonl", rows[:1])
    (record,) = load_preference_records(str(path), conversational=True)
    assert record["prompt"] == [user]
    assert record["chosen"] == [{"role": "assistant", "content": "2"}]
    explicit = {"prompt": [user], "chosen": "2", "rejected": "3", "where": "x"}
    assert (
        tokenize_dpo_pairs([record], tok, 256)[0]["chosen"]
        == (tokenize_dpo_pairs([explicit], tok, 256)[0]["chosen"])
    )
    bad = _write_jsonl(tmp_path / "bad.jsonl", rows[1:])
    with pytest.raises(ValueError, match=rf"^{bad}:1: without a 'prompt', 'chosen' and 'rejected'"):
        load_preference_records(str(bad), conversational=True)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "p", "chosen": "same", "rejected": "same"}, "are the same text"),
        ({"prompt": "p", "chosen": " ", "rejected": "x"}, "field 'chosen' is empty"),
        ({"prompt": "p", "chosen": "x", "rejected": ""}, "field 'rejected' is empty"),
        ({"prompt": "p", "chosen": "x"}, "missing field 'rejected'"),
        ({"prompt": "p", "chosen": 3, "rejected": "x"}, "must be a string or a list of turns"),
        (
            {"prompt": "p", "chosen": [{"role": "assistant", "content": ""}], "rejected": "x"},
            "chosen[0]: an assistant turn is empty",
        ),
        (
            {"prompt": "p", "chosen": [{"role": "user", "content": "hi"}], "rejected": "x"},
            "field 'chosen' has no assistant turn",
        ),
    ],
)
def test_bad_pair_names_file_and_line(tmp_path, row, message):
    path = _write_jsonl(
        tmp_path / "d.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}, row]
    )
    with pytest.raises(ValueError) as info:
        load_preference_records(str(path), conversational=True)
    text = str(info.value)
    assert text.startswith(f"{path}:2"), text
    assert message in text and "\n" not in text


@pytest.mark.parametrize(
    ("record", "kwargs", "message"),
    [
        ({"chosen": "é", "rejected": "ü"}, {}, "'chosen' and 'rejected' give the same tokens"),
        ({"chosen": "1" * 300, "rejected": "2"}, {}, "prompt + chosen is"),
        (
            {"chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"},
            {"use_chat_template": False},
            "a conversational pair (a list of turns) needs the tokenizer's chat template",
        ),
    ],
)
def test_bad_tokenized_pair_names_file_and_line(tok, record, kwargs, message):
    record = {"prompt": "q", "where": "prefs.jsonl:7", **record}
    with pytest.raises(ValueError) as info:
        tokenize_dpo_pairs([record], tok, 256, **kwargs)
    assert str(info.value).startswith("prefs.jsonl:7: ") and message in str(info.value)


# ------------------------------------------------------------------ the engine with the loss
def _hand_dpo_loss(model: torch.nn.Module, batch: dict, beta: float) -> torch.Tensor:
    """The DPO loss over all pairs from a plain padded forward and a full log_softmax."""
    attn = batch["attention_mask"].long()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch["input_ids"], attention_mask=attn, position_ids=pos).logits
    logp = torch.log_softmax(logits[:, :-1].double(), -1)
    tgt = logp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["loss_mask"][:, 1:]
    ratio = ((tgt - batch["ref_logp"][:, 1:].double()) * mask).sum(-1).view(-1, 2)
    h = ratio[:, 0] - ratio[:, 1]
    return torch.log1p(torch.exp(-beta * h)).mean()  # -log sigmoid(beta h)


@pytest.mark.parametrize(
    "packing,n_mbs,budget", [(False, 1, None), (True, 3, None), (False, 1, 60)]
)
def test_engine_step_equals_the_hand_dpo_loss(tok, data, packing, n_mbs, budget):
    """train_batch with DPOLoss: its loss is the hand pair mean and its update (SGD, lr 1, no
    clipping) is minus the hand loss's gradient, for any micro-batch split that keeps pairs
    together (a random reference, so the pairs have different log-ratios)."""
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.trainer.dpo_trainer import DPOLoss, dpo_loss_weight

    torch.manual_seed(0)
    cfg = TrainEngineConfig(
        path="builtin:tiny",
        optimizer=OptimizerConfig(type="sgd", lr=1.0, beta1=0.0, gradient_clipping=0.0),
        mb_spec=MicroBatchSpec(n_mbs=n_mbs, packing=packing, max_tokens_per_mb=budget),
    )
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
    records = load_preference_records(str(data[0]), max_samples=5, conversational=True)
    batch = collate_dpo(tokenize_dpo_pairs(records, tok, 256), tok.pad_token_id)
    batch["ref_logp"] = -torch.rand(batch["input_ids"].shape) * 3
    assert len(engine.micro_batches(batch, 2)) > 1 or (n_mbs, budget) == (1, None)
    model = engine.unwrapped
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    hand = _hand_dpo_loss(model, batch, 0.5)
    grads = torch.autograd.grad(hand, list(model.parameters()))
    _, stats = engine.train_batch(batch, DPOLoss(0.5), dpo_loss_weight, group_size=2)
    assert stats["loss"] == pytest.approx(float(hand.detach()), rel=1e-5)
    for (name, p), g in zip(model.named_parameters(), grads):
        torch.testing.assert_close(
            before[name] - p.detach(), g.float(), rtol=1e-4, atol=1e-6, msg=name
        )


# ---------------------------------------------------------------------------- run and resume
def make_cfg(tmp_path: Path, data: tuple[Path, Path], name: str = "run", **kw) -> DPOConfig:
    fields = dict(
        seed=3,
        output_dir=str(tmp_path / name),
        total_train_epochs=2,
        num_threads=1,
        beta=0.5,
        model=TrainEngineConfig(path="builtin:tiny", optimizer=OptimizerConfig(lr=3e-3)),
        train_dataset=PreferenceDatasetConfig(path=str(data[0]), batch_size=8),
        valid_dataset=PreferenceDatasetConfig(path=str(data[1]), batch_size=8, shuffle=False),
        evaluator=EvaluatorConfig(freq_steps=4, eval_at_start=True, eval_at_end=True),
        saver=SaverConfig(save_at_end=True),
        recover=RecoverConfig(),
        stats_logger=StatsLoggerConfig(progress_bar=False, console=False),
    )
    fields.update(kw)
    return DPOConfig(**fields)


def _evals(out: str | Path) -> list[dict]:
    return [m for m in read_metrics(out) if "eval/accuracy" in m]


@pytest.mark.parametrize(
    "kw",
    [{}, {"loss_type": "ipo", "beta": 0.1}, {"label_smoothing": 0.1}],
    ids=["sigmoid", "ipo", "smoothed"],
)
def test_run_raises_held_out_preference_accuracy(tmp_path, data, kw):
    """From pi = pi_ref (every held-out pair a tie: accuracy 0, loss of the pair-mean at h=0)
    to the chosen answer preferred on nearly every held-out pair."""
    from transformers import AutoModelForCausalLM

    from areal_m2po.trainer.dpo_trainer import run

    cfg = make_cfg(tmp_path, data, **kw)
    assert run(cfg) == 0
    evals = _evals(cfg.output_dir)
    assert [m["step"] for m in evals] == [0, 4, 8]
    first, last = evals[0], evals[-1]
    assert (first["eval/accuracy"], first["eval/margin"]) == (0.0, 0.0)
    h0_loss = (1 / (2 * cfg.beta)) ** 2 if cfg.loss_type == "ipo" else math.log(2)
    assert first["eval/loss"] == pytest.approx(h0_loss)
    assert last["eval/accuracy"] >= 0.9 and last["eval/margin"] > 0
    assert last["eval/chosen_reward"] > last["eval/rejected_reward"]
    assert last["eval/loss"] < first["eval/loss"] and last["eval/n_pairs"] == 16
    steps = [m for m in read_metrics(cfg.output_dir) if "dpo/loss" in m]
    assert [m["dpo/n_pairs"] for m in steps] == [8.0] * 8
    AutoModelForCausalLM.from_pretrained(Path(cfg.output_dir) / "checkpoints" / "final")


def test_lora_run_uses_the_adapter_free_model_as_reference(tmp_path, data):
    from areal_m2po.engine.lora_reference import LoRABaseReference
    from areal_m2po.trainer.dpo_trainer import DPOTrainer

    model = TrainEngineConfig(
        path="builtin:tiny", optimizer=OptimizerConfig(lr=1e-2), lora=LoRAConfig(r=4)
    )
    trainer = DPOTrainer(make_cfg(tmp_path, data, model=model))
    try:
        assert isinstance(trainer.reference, LoRABaseReference)
        trainer.train()
    finally:
        trainer.close()
    evals = _evals(trainer.output_dir)
    assert evals[0]["eval/margin"] == 0.0 and evals[-1]["eval/accuracy"] >= 0.9
    assert (Path(trainer.output_dir) / "checkpoints" / "final" / "adapter_config.json").is_file()


def test_ref_path_loads_another_reference(tmp_path, data):
    """A reference trained to prefer the chosen answers: the untrained policy's implicit
    rewards start below it on the chosen answers (margin < 0 at step 0)."""
    from areal_m2po.trainer.dpo_trainer import run

    trained = make_cfg(tmp_path, data, "ref", valid_dataset=None, total_train_steps=4)
    assert run(trained) == 0
    ref = str(Path(trained.output_dir) / "checkpoints" / "final")
    cfg = make_cfg(tmp_path, data, "other", ref_path=ref, total_train_steps=1)
    assert run(cfg) == 0
    assert _evals(cfg.output_dir)[0]["eval/margin"] < 0


def test_sigkill_and_rerun_continues_bitwise(tmp_path, data):
    """6 steps straight == 3 steps, SIGKILL, rerun the same config (recover.mode=auto)."""
    from areal_m2po.api.config_loader import save_config
    from areal_m2po.trainer.dpo_trainer import run

    def cfg(name: str) -> DPOConfig:
        return make_cfg(
            tmp_path,
            data,
            name,
            total_train_steps=6,
            evaluator=EvaluatorConfig(freq_steps=2),
            recover=RecoverConfig(mode="auto", freq_steps=1, keep_last=2),
        )

    crashed = cfg("crashed")
    cfg_file = save_config(crashed, tmp_path / "crashed.yaml")
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT / "recover_worker.py"), str(cfg_file), "3", "dpo"],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    straight = cfg("straight")
    assert run(straight) == 0
    expected = read_metrics(straight.output_dir)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    root = recover.recover_root(crashed.output_dir)
    assert [s for s, _ in recover.list_checkpoints(root)] == [2, 3]
    assert run(crashed) == 0
    got = read_metrics(crashed.output_dir)
    assert [r["step"] for r in got] == list(range(7))
    for a, b in zip(got, expected):
        assert untimed(a) == untimed(b), a["step"]  # bitwise: floats compared with ==


# ------------------------------------------------------------------------------------- CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "areal_m2po.train_dpo", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _last_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    return proc.stderr.strip().splitlines()[-1]


def test_cli_help_config_and_one_line_errors(tmp_path, data):
    helped = _cli("--help")
    assert helped.returncode == 0
    for key in ("beta", "label_smoothing", "loss_type", "ref_path", "model.lora.r"):
        assert key in helped.stdout
    printed = _cli("--print-config", "beta=0.3", "--loss_type", "ipo")
    assert printed.returncode == 0 and "beta: 0.3" in printed.stdout
    assert "loss_type: ipo" in printed.stdout
    out = f"output_dir={tmp_path / 'out'}"
    assert _last_error(_cli("beta=0", out)) == "error: beta: must be > 0, got 0.0"
    assert "label_smoothing: must be < 0.5" in _last_error(_cli("label_smoothing=0.5", out))
    ipo = _last_error(_cli("loss_type=ipo", "label_smoothing=0.1", out))
    assert "label_smoothing: must be 0 with loss_type=ipo" in ipo
    assert "train_dataset.path: must be set" in _last_error(_cli(out))
    assert "betta" in _last_error(_cli("betta=0.1", out))
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "a"}])
    line = _last_error(_cli("model.path=builtin:tiny", f"train_dataset.path={bad}", out))
    assert line == f"error: {bad}:1: 'chosen' and 'rejected' are the same text"
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_cli_trains_and_saves(tmp_path, data):
    from areal_m2po.train_dpo import main

    out = tmp_path / "cli"
    status = main(
        [
            "model.path=builtin:tiny",
            f"train_dataset.path={data[0]}",
            f"--valid_dataset.path={data[1]}",
            "--output_dir",
            str(out),
            "total_train_steps=2",
            "train_dataset.batch_size=4",
            "model.optimizer.lr=1e-3",
            "stats_logger.progress_bar=false",
            "stats_logger.console=false",
        ]
    )
    assert status == 0
    assert [m["step"] for m in read_metrics(out)] == [0, 1, 2]
    assert (out / "checkpoints" / "final" / "model.safetensors").is_file()


def test_shipped_dpo_config_loads():
    from areal_m2po.api.config_loader import load_config

    cfg = load_config(["--config", str(REPO / "configs" / "rlhf" / "dpo.yaml")], DPOConfig)
    assert (cfg.beta, cfg.loss_type, cfg.label_smoothing) == (0.1, "sigmoid", 0.0)
    assert cfg.valid_dataset is not None and cfg.recover.mode == "auto"
    assert cfg.output_dir == "outputs/rlhf-dpo/trial0"
