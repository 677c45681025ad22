"""LoRA through peft on the tiny model: only adapter parameters train and hold optimizer state,
the merged weights give the adapter model's log-probs, the adapter-disabled model is the base
model, saves, the critic and the reward model with LoRA, and PPO with LoRA (M2PO, decoupled
loss, KL to the base model) resuming exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from procs import read_metrics, spawn_train, tiny_train_args, untimed
from tiny_runs import make_cfg

from areal_m2po.api.cli_args import (
    ActorConfig,
    ConfigError,
    LoRAConfig,
    MicroBatchSpec,
    OptimizerConfig,
    PPOConfig,
    SaverConfig,
    StatsLoggerConfig,
    TrainEngineConfig,
)

pytestmark = pytest.mark.usefixtures("restore_threads")


def _batch(tok, n=4):
    from areal_m2po.dataset.sft import collate_sft, tokenize_sft_records

    records = [
        {"prompt": f"What is {i} + {i}?", "completion": str(2 * i) * (1 + i % 3), "where": f"r{i}"}
        for i in range(10, 10 + n)
    ]
    return collate_sft(tokenize_sft_records(records, tok, 256), tok.pad_token_id)


def _engine(lora: LoRAConfig | None, lr=1e-2, packing=True):
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    torch.manual_seed(0)
    cfg = TrainEngineConfig(
        path="builtin:tiny",
        optimizer=OptimizerConfig(lr=lr),
        mb_spec=MicroBatchSpec(packing=packing),
        lora=lora,
    )
    return HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=10)


def _train(engine, batch, steps=3):
    from areal_m2po.trainer.sft_trainer import sft_loss_weight, sft_microbatch_loss

    for _ in range(steps):
        engine.train_batch(batch, sft_microbatch_loss, sft_loss_weight)


def test_config_checks():
    with pytest.raises(ConfigError, match="^r: must be >= 1"):
        LoRAConfig(r=0)
    with pytest.raises(ConfigError, match="^target_modules: must be a non-empty list"):
        LoRAConfig(target_modules=[])
    with pytest.raises(ConfigError, match="^dropout: must be < 1"):
        LoRAConfig(dropout=1.0)


def test_only_adapter_parameters_train_and_hold_optimizer_state(tok):
    engine = _engine(LoRAConfig(r=4))
    model = engine.unwrapped
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _train(engine, _batch(tok))
    changed = {n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())}
    assert changed  # the adapters moved (B leaves zero, then A follows)
    assert changed <= names
    assert all(n in changed for n in names if ".lora_B." in n)
    state_params = {id(p) for p in engine.optimizer.state}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert state_params == trainable
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    assert n_train < 0.5 * n_all


def test_gradient_checkpointing_with_lora_trains_the_adapters(tok):
    """Checkpointed layers over frozen embeddings still pass a gradient to the adapters."""
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    cfg = TrainEngineConfig(
        path="builtin:tiny",
        gradient_checkpointing=True,
        optimizer=OptimizerConfig(lr=1e-2),
        lora=LoRAConfig(r=2),
    )
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
    before = {
        n: p.detach().clone() for n, p in engine.unwrapped.named_parameters() if ".lora_B." in n
    }
    _train(engine, _batch(tok), steps=1)
    after = dict(engine.unwrapped.named_parameters())
    assert all(not torch.equal(before[n], after[n].detach()) for n in before)


def test_target_modules_select_the_adapted_layers(tok):
    engine = _engine(LoRAConfig(r=2, target_modules=["q_proj", "v_proj"]))
    adapted = {
        n.split(".lora_")[0].rsplit(".", 1)[-1]
        for n, _ in engine.unwrapped.named_parameters()
        if ".lora_A." in n
    }
    assert adapted == {"q_proj", "v_proj"}
    with pytest.raises(ValueError, match=r"^lora.target_modules=\['nope'\]"):
        _engine(LoRAConfig(target_modules=["nope"]))


def test_merged_weights_give_the_adapter_models_logprobs(tok):
    """The merged plain model (what the rollout engine gets) against the adapter model, both
    through the padded forward: within 1e-5 per token."""
    from areal_m2po.engine.forward import forward_logprobs

    engine = _engine(LoRAConfig(r=4, alpha=16))
    batch = _batch(tok)
    _train(engine, batch, steps=4)
    plain = engine.build_full_model()
    assert type(plain).__name__ == "LlamaForCausalLM"
    names = dict(engine.full_tensors())
    assert set(names) == set(plain.state_dict())
    with torch.no_grad():
        adapted, _ = forward_logprobs(engine.model.eval(), batch, 1.0, False)
        merged, _ = forward_logprobs(plain.eval(), batch, 1.0, False)
    mask = batch["loss_mask"]
    assert float((adapted[mask] - merged[mask]).abs().max()) < 1e-5
    base, _ = engine.forward_tokens_base(batch, 1.0)
    assert float((base[mask] - adapted[mask]).abs().max()) > 1e-3  # the adapter matters


def test_adapter_disabled_equals_the_base_model(tok):
    engine = _engine(LoRAConfig(r=4))
    batch = _batch(tok)
    _train(engine, batch)
    reference = _engine(None)  # the same seed: the same tiny base weights from disk
    got, _ = engine.forward_tokens_base(batch, 0.7)
    want, _ = reference.forward_tokens(batch, 0.7)
    mask = batch["loss_mask"]
    torch.testing.assert_close(got[mask], want[mask], rtol=0, atol=1e-6)
    after, _ = engine.forward_tokens(batch, 0.7)  # the adapter is back on afterwards
    assert float((after[mask] - want[mask]).abs().max()) > 1e-3


def test_save_writes_the_adapter_and_the_merged_model(tmp_path, tok):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.forward import forward_logprobs

    engine = _engine(LoRAConfig(r=4, save_merged=True))
    batch = _batch(tok)
    _train(engine, batch)
    engine.save_hf(str(tmp_path / "save"), tok)
    assert (tmp_path / "save" / "adapter_config.json").is_file()
    assert not (tmp_path / "save" / "model.safetensors").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "save" / "merged")
    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin:tiny"))
    reloaded = PeftModel.from_pretrained(base, tmp_path / "save")
    with torch.no_grad():
        want, _ = forward_logprobs(engine.model.eval(), batch, 1.0, False)
        a, _ = forward_logprobs(merged.eval(), batch, 1.0, False)
        b, _ = forward_logprobs(reloaded.eval(), batch, 1.0, False)
    mask = batch["loss_mask"]
    assert float((a[mask] - want[mask]).abs().max()) < 1e-5
    assert float((b[mask] - want[mask]).abs().max()) < 1e-5


def test_critic_with_lora_trains_its_value_head():
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.trainer.ppo.critic import forward_values, load_value_model

    model = load_value_model("builtin:tiny", "float32", "sdpa")
    cfg = TrainEngineConfig(path="builtin:tiny", lora=LoRAConfig(r=2))
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), 1, model=model, forward_fn=forward_values)
    names = [n for n, p in engine.unwrapped.named_parameters() if p.requires_grad]
    assert any(".modules_to_save." in n and "score" in n for n in names)
    assert all(".lora_" in n or ".modules_to_save." in n for n in names)


def test_reward_model_with_lora_saves_a_loadable_merged_model(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from areal_m2po.api.cli_args import PreferenceDatasetConfig, RWConfig, RWModelConfig
    from areal_m2po.trainer.rw_trainer import RWTrainer

    rows = [
        {"prompt": f"What is {i} + {i}?", "chosen": str(2 * i), "rejected": f"{2 * i} maybe"}
        for i in range(10, 18)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RWConfig(
        output_dir=str(tmp_path / "rm"),
        total_train_steps=2,
        num_threads=1,
        model=RWModelConfig(
            path="builtin:tiny",
            optimizer=OptimizerConfig(lr=1e-2),
            lora=LoRAConfig(r=2, save_merged=True),
        ),
        train_dataset=PreferenceDatasetConfig(path=str(data), batch_size=4),
        stats_logger=StatsLoggerConfig(progress_bar=False),
    )
    trainer = RWTrainer(cfg)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("score" in n for n in trainable)
    assert all(".lora_" in n or ".modules_to_save." in n for n in trainable)
    trainer.train()
    with torch.no_grad():
        ids = torch.tensor([[1, 5, 9, 12]])
        want = trainer.model.eval()(input_ids=ids).logits
    trainer.close()
    final = Path(cfg.output_dir) / "checkpoints" / "final"
    assert (final / "adapter_config.json").is_file()
    merged = AutoModelForSequenceClassification.from_pretrained(final / "merged")
    with torch.no_grad():
        got = merged.eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- PPO
def _ppo_cfg(tmp_path, name, steps) -> PPOConfig:
    """The shared tiny run (one step stale) with a LoRA actor, the decoupled loss, a KL term
    and a final save."""
    actor = ActorConfig(
        path="builtin:tiny",
        m2_threshold=0.04,
        use_decoupled_loss=True,
        kl_ctl=0.1,
        optimizer=OptimizerConfig(lr=3e-3),
        lora=LoRAConfig(r=4),
    )
    return make_cfg(tmp_path, name, steps, actor=actor, saver=SaverConfig(save_at_end=True))


def test_ppo_with_lora_runs_and_resumes_exactly(tmp_path):
    """4 sync steps straight == 2 steps, then the same run resumed to 4 (recover.mode=auto);
    the KL reference is the base model (no reference engine loaded)."""
    from areal_m2po.trainer.rl_trainer import RLTrainer, run

    straight = _ppo_cfg(tmp_path, "straight", 4)
    trainer = RLTrainer(straight)
    try:
        assert type(trainer.ref_engine).__name__ == "LoRABaseReference"
        assert type(trainer.rollout.engine.generator.model).__name__ == "LlamaForCausalLM"
        trainer.train()
    finally:
        trainer.close()
    expected = read_metrics(straight.output_dir)
    assert [r["step"] for r in expected] == [1, 2, 3, 4]
    assert all(r["actor/kl_ref"] == r["actor/kl_ref"] for r in expected)
    assert any(abs(r["actor/kl_ref"]) > 0 for r in expected[1:])
    assert (Path(straight.output_dir) / "checkpoints" / "final" / "adapter_config.json").is_file()

    assert run(_ppo_cfg(tmp_path, "resumed", 2)) == 0
    assert run(_ppo_cfg(tmp_path, "resumed", 4)) == 0
    got = read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    for a, b in zip(got, expected):
        assert untimed(a) == untimed(b), a["step"]


@pytest.mark.slow
def test_async_ppo_with_lora_hands_merged_weights_to_the_servers(tmp_path):
    """rollout.mode=async with a LoRA actor: the servers start from the base model and load the
    merged weights (plain names, no adapter tensors) each step."""
    from safetensors.torch import load_file

    run_dir = tmp_path / "run"
    args = tiny_train_args(
        run_dir,
        2,
        "rollout.mode=async",
        "rollout.staleness=0",
        "rollout.max_head_offpolicyness=1",
        "rollout.server_threads=1",
        "actor.lora.r=4",
        "actor.optimizer.lr=1e-2",
    )
    proc = spawn_train(args)
    try:
        _, err = proc.communicate(timeout=400)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    files = sorted((run_dir / "rollout_weights" / "v2").glob("*.safetensors"))
    assert files
    names = set()
    for f in files:
        names |= set(load_file(f))
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert not any("lora_" in n or "base_layer" in n for n in names)
