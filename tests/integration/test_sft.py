"""Supervised fine-tuning on the tiny model: the loss against a hand computation, the masks of
prompt/completion and chat records, no gradient through prompt tokens, bad records, the CLI,
and exact resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from procs import REPO, SUPPORT, read_metrics, subprocess_env, untimed

from areal_m2po.algo.sft_loss import sft_nll_loss
from areal_m2po.api.cli_args import (
    EvaluatorConfig,
    MicroBatchSpec,
    OptimizerConfig,
    RecoverConfig,
    SaverConfig,
    SFTConfig,
    SFTDatasetConfig,
    StatsLoggerConfig,
    TrainEngineConfig,
)
from areal_m2po.utils import recover

pytestmark = pytest.mark.usefixtures("restore_threads")


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------ the loss
def test_sft_nll_loss_is_the_masked_token_mean():
    logp = torch.tensor([[-9.0, -1.0, -2.0, 0.0], [-7.0, -3.0, -5.0, -6.0]])
    mask = torch.tensor([[False, True, True, False], [False, False, True, True]])
    loss, stats = sft_nll_loss(logp, mask)
    assert float(loss) == pytest.approx((1 + 2 + 5 + 6) / 4)
    assert float(stats["nll"]) == pytest.approx(3.5)
    empty, _ = sft_nll_loss(logp, torch.zeros_like(mask))
    assert float(empty) == 0.0


# ------------------------------------------------------------------------------- tokenization
def test_prompt_completion_mask_covers_the_assistant_turn(tok):
    from areal_m2po.dataset.sft import tokenize_sft_example

    ids, mask = tokenize_sft_example({"prompt": "What is 1 + 2?", "completion": "3"}, tok)
    full = tok.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}, {"role": "assistant", "content": "3"}],
        tokenize=False,
    )
    assert tok.decode(ids) == full
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "3<|im_end|>\n"


def test_chat_mask_covers_every_assistant_turn_and_nothing_else(tok):
    from areal_m2po.dataset.sft import tokenize_sft_example

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    ids, mask = tokenize_sft_example({"messages": messages}, tok)
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "2<|im_end|>\n4<|im_end|>\n"
    assert tok.decode(ids) == tok.apply_chat_template(messages, tokenize=False)


def test_a_tool_turn_is_context_rendered_as_the_template_renders_it(tok, tmp_path):
    from areal_m2po.dataset.sft import load_sft_records, tokenize_sft_example

    messages = [
        {"role": "user", "content": "37*45?"},
        {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
        {"role": "tool", "content": "1665"},
        {"role": "assistant", "content": "1665"},
    ]
    path = _write_jsonl(tmp_path / "tool.jsonl", [{"messages": messages}])
    (record,) = load_sft_records(str(path))  # a tool turn is a known role
    assert record["messages"] == messages
    ids, mask = tokenize_sft_example(record, tok)
    assert tok.decode(ids) == tok.apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>tool\n1665<|im_end|>" in tok.decode(ids)  # as the agent endpoint
    learned = tok.decode([i for i, m in zip(ids, mask) if m])
    assert learned == "<tool_call>{}</tool_call><|im_end|>\n1665<|im_end|>\n"


def test_plain_text_without_template_appends_eos(tok):
    from areal_m2po.dataset.sft import tokenize_sft_example

    ids, mask = tokenize_sft_example({"prompt": "ab", "completion": "cd"}, tok, False)
    learned = [i for i, m in zip(ids, mask) if m]
    assert learned[-1] == tok.eos_token_id
    assert tok.decode(learned[:-1]) == "cd"


def test_collate_aligns_the_first_loss_token():
    from areal_m2po.dataset.sft import collate_sft

    examples = [
        {"input_ids": [5, 6, 7, 8], "loss_mask": [False, False, True, True]},
        {"input_ids": [1, 2, 3, 4, 9, 9], "loss_mask": [False, False, False, True, False, True]},
    ]
    batch = collate_sft(examples, pad_id=0)
    assert batch["input_ids"].tolist() == [[0, 5, 6, 7, 8, 0], [1, 2, 3, 4, 9, 9]]
    assert batch["loss_mask"][:, 3].all()  # the first loss token of both rows
    assert batch["loss_mask"].sum(-1).tolist() == [2, 2]
    assert batch["attention_mask"].sum(-1).tolist() == [4, 6]


# ------------------------------------------------------------------- the engine with the loss
def _independent_nll(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """The token-mean NLL over all rows, from a plain padded forward and a full log_softmax."""
    attn = batch["attention_mask"].long()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=batch["input_ids"], attention_mask=attn, position_ids=pos).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1)
    tgt = logp.gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["loss_mask"][:, 1:]
    return -(tgt * mask).sum() / mask.sum()


def _tiny_examples(tok, n=5):
    from areal_m2po.dataset.sft import tokenize_sft_records

    records = [
        {"prompt": f"What is {i} + {i}?", "completion": str(2 * i) * (1 + i % 3), "where": f"r{i}"}
        for i in range(10, 10 + n)
    ]
    return tokenize_sft_records(records, tok, 256)


@pytest.mark.parametrize("packing,n_mbs", [(False, 1), (True, 3), (False, 2)])
def test_engine_step_equals_the_hand_token_mean(tok, packing, n_mbs):
    """train_batch's loss is the global token mean and its update (SGD, lr 1, no clipping) is
    minus the gradient of the hand-computed token mean, for any micro-batch split: a longer
    micro-batch weighs by its tokens, not by a per-micro-batch mean."""
    from accelerate import Accelerator

    from areal_m2po.dataset.sft import collate_sft
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.trainer.sft_trainer import sft_loss_weight, sft_microbatch_loss

    torch.manual_seed(0)
    cfg = TrainEngineConfig(
        path="builtin:tiny",
        optimizer=OptimizerConfig(type="sgd", lr=1.0, beta1=0.0, gradient_clipping=0.0),
        mb_spec=MicroBatchSpec(n_mbs=n_mbs, packing=packing),
    )
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
    batch = collate_sft(_tiny_examples(tok), tok.pad_token_id)
    model = engine.unwrapped
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    ref = _independent_nll(model, batch)
    grads = torch.autograd.grad(ref, list(model.parameters()))
    _, loss_stats = engine.train_batch(batch, sft_microbatch_loss, sft_loss_weight)
    assert loss_stats["nll"] == pytest.approx(float(ref.detach()), rel=1e-5)
    for (name, p), g in zip(model.named_parameters(), grads):
        torch.testing.assert_close(before[name] - p.detach(), g, rtol=1e-4, atol=1e-6, msg=name)


def test_prompt_tokens_get_no_gradient(tok):
    """The gradient of the loss with respect to the logits is zero at every position that
    predicts a prompt (user/system) token, including a user turn between two assistant turns;
    and changing those tokens' targets leaves the loss unchanged."""
    from accelerate import Accelerator

    from areal_m2po.dataset.sft import collate_sft, tokenize_sft_records
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.trainer.sft_trainer import sft_microbatch_loss

    messages = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    examples = tokenize_sft_records([{"messages": messages, "where": "m"}], tok, 256)
    batch = collate_sft(examples, tok.pad_token_id)
    cfg = TrainEngineConfig(path="builtin:tiny", mb_spec=MicroBatchSpec(packing=False))
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
    captured = {}

    def keep(_module, _inputs, output):
        output.retain_grad()
        captured["logits"] = output

    handle = engine.unwrapped.lm_head.register_forward_hook(keep)
    logp, ent = engine.forward_fn(engine.model, batch, 1.0, False)
    loss, _ = sft_microbatch_loss(logp, ent, batch)
    loss.backward()
    handle.remove()
    logits = captured["logits"]  # [1, kept, vocab]: positions start-1 .. T-1
    t = batch["input_ids"].shape[1]
    kept = logits.shape[1]
    start = t - kept + 1
    predicted = batch["loss_mask"][0, start - 1 + 1 : t + 1]  # the token each kept row predicts
    predicted = torch.cat([predicted, torch.zeros(kept - predicted.numel(), dtype=torch.bool)])
    row_grad = logits.grad[0].abs().sum(-1)
    assert (~predicted).any() and predicted.any()
    assert float(row_grad[~predicted].max()) == 0.0
    assert float(row_grad[predicted].min()) > 0.0


# ------------------------------------------------------------------------------- bad records
@pytest.mark.parametrize(
    "row,message",
    [
        ({"prompt": "a"}, "missing field 'completion'"),
        ({"prompt": "a", "completion": "  "}, "field 'completion' is empty"),
        ({"prompt": "a", "completion": 3}, "field 'completion' must be a string"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "has no assistant turn"),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "role must be one of"),
        ({"messages": "hello"}, "must be a non-empty list of turns"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_record_names_file_and_line(tmp_path, row, message):
    from areal_m2po.dataset.sft import load_sft_records

    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "completion": "c"}, row])
    with pytest.raises(ValueError) as info:
        load_sft_records(str(path))
    text = str(info.value)
    assert text.startswith(f"{path}:2"), text
    assert message in text and "\n" not in text


def test_too_long_example_names_file_and_line(tmp_path, tok):
    from areal_m2po.dataset.sft import load_sft_records, tokenize_sft_records

    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "completion": "c" * 200}])
    records = load_sft_records(str(path))
    with pytest.raises(ValueError, match=rf"^{path}:1: the example is \d+ tokens, longer"):
        tokenize_sft_records(records, tok, 64)


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, "-m", "areal_m2po.train_sft", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_help_config_and_one_line_errors(tmp_path):
    helped = _cli("--help")
    assert helped.returncode == 0 and "model.lora.r" in helped.stdout
    assert "train_dataset.messages_field" in helped.stdout
    printed = _cli("--print-config", "--model.lora.r", "4", "train_dataset.batch_size=2")
    assert printed.returncode == 0 and "r: 4" in printed.stdout
    bad_key = _cli("model.lora.rank=4")
    assert bad_key.returncode == 2 and bad_key.stderr.count("\n") == 1
    assert "model.lora.rank" in bad_key.stderr
    path = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "completion": "c"}, {"x": 1}])
    bad_row = _cli(
        "model.path=builtin:tiny",
        f"train_dataset.path={path}",
        "valid_dataset=null",
        f"output_dir={tmp_path / 'out'}",
    )
    assert bad_row.returncode == 2, bad_row.stderr[-2000:]
    last = bad_row.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}:2: missing field 'prompt'"), last


# ---------------------------------------------------------------------------- run and resume
def make_cfg(tmp_path, name="run", steps=4, **kw) -> SFTConfig:
    fields = dict(
        seed=3,
        output_dir=str(tmp_path / name),
        total_train_steps=steps,
        total_train_epochs=3,
        num_threads=1,
        model=TrainEngineConfig(path="builtin:tiny", optimizer=OptimizerConfig(lr=3e-3)),
        train_dataset=SFTDatasetConfig(batch_size=4, max_samples=12),
        valid_dataset=SFTDatasetConfig(split="test", batch_size=8, max_samples=8, shuffle=False),
        evaluator=EvaluatorConfig(freq_steps=2, eval_at_start=True, eval_at_end=True),
        saver=SaverConfig(save_at_end=True),
        recover=RecoverConfig(mode="auto", freq_steps=1, keep_last=2),
        stats_logger=StatsLoggerConfig(progress_bar=False),
    )
    fields.update(kw)
    return SFTConfig(**fields)


def test_run_learns_and_writes_the_outputs_layout(tmp_path):
    from transformers import AutoModelForCausalLM

    from areal_m2po.plot import SFT_PANELS, panels_for, plot_run
    from areal_m2po.trainer.sft_trainer import run

    cfg = make_cfg(tmp_path, steps=6, recover=RecoverConfig())
    assert run(cfg) == 0
    out = Path(cfg.output_dir)
    assert (out / "config.yaml").is_file()
    metrics = read_metrics(out)
    evals = [m for m in metrics if "eval/loss" in m]
    assert [m["step"] for m in evals] == [0, 2, 4, 6]
    assert evals[-1]["eval/loss"] < evals[0]["eval/loss"]
    assert evals[-1]["eval/perplexity"] == pytest.approx(2.718281828 ** evals[-1]["eval/loss"])
    assert all(m["sft/n_tokens"] > 0 for m in metrics if m["step"] > 0)
    AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "final")
    assert panels_for(metrics) is SFT_PANELS
    assert Path(plot_run(str(out))).is_file()


def test_sigkill_and_rerun_continues_bitwise(tmp_path):
    """4 steps straight == 2 steps, SIGKILL, rerun the same command (recover.mode=auto)."""
    from areal_m2po.api.config_loader import save_config
    from areal_m2po.trainer.sft_trainer import run

    crashed = make_cfg(tmp_path, "crashed")
    cfg_file = save_config(crashed, tmp_path / "crashed.yaml")
    env = subprocess_env()
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT / "recover_worker.py"), str(cfg_file), "2", "sft"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    straight = make_cfg(tmp_path, "straight")
    assert run(straight) == 0
    expected = read_metrics(straight.output_dir)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    root = recover.recover_root(crashed.output_dir)
    assert [s for s, _ in recover.list_checkpoints(root)] == [1, 2]
    assert run(crashed) == 0
    got = read_metrics(crashed.output_dir)
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4]
    for a, b in zip(got, expected):
        assert untimed(a) == untimed(b), a["step"]  # bitwise: floats compared with ==


def test_resume_refuses_another_dataset(tmp_path, capsys):
    from areal_m2po.trainer.sft_trainer import run

    assert run(make_cfg(tmp_path, steps=1)) == 0
    other = make_cfg(tmp_path, steps=2, seed=4)
    assert run(other) == 2  # refused at start-up, before any model loads
    assert "was written with seed 3 -> 4, which cannot change" in capsys.readouterr().err
