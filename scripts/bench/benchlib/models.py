"""The benchmarks' models and data: tiny Llamas by size (built by the engine's tiny-model
builder), SmolLM2-135M, a synthetic rollout batch in the trainer's layout, and the model FLOPs
of one update step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from areal_m2po.algo.normalization import group_normalize

# (hidden, layers, heads, kv heads, intermediate, vocab): Llamas built from a config, saved with
# the 99-token built-in tokenizer. "135m" is SmolLM2-135M's architecture with random weights (no
# download; its extra token ids decode to nothing, so rewards are 0 but every stage runs).
TINY_SIZES: dict[str, tuple[int, int, int, int, int, int | None]] = {
    "1m": (128, 5, 4, 2, 384, None),
    "10m": (384, 6, 6, 2, 1024, None),
    "135m": (576, 30, 9, 3, 1536, 49152),
}


@dataclass
class ModelSpec:
    name: str
    model: torch.nn.Module
    path: str  # a folder RLTrainer can load (model + tokenizer)
    n_params: int
    matmul_params: int  # parameters of the per-token matmuls (not the input embedding)
    hidden: int
    layers: int
    q_dim: int  # heads x head_dim
    vocab: int
    prompt_len: tuple[int, int]  # prompt lengths of the synthetic batch (min, max)


def _count_matmul_params(model: torch.nn.Module) -> int:
    """Weights of the decoder layers' linear maps (the LM head is counted per scored token)."""
    total = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and "lm_head" not in name:
            total += mod.weight.numel()
    return total


def _spec_from_model(name: str, model: torch.nn.Module, path: str, prompt_len: tuple[int, int]):
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return ModelSpec(
        name=name,
        model=model,
        path=path,
        n_params=sum(p.numel() for p in model.parameters()),
        matmul_params=_count_matmul_params(model),
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        q_dim=cfg.num_attention_heads * head_dim,
        vocab=cfg.vocab_size,
        prompt_len=prompt_len,
    )


def build_model(name: str, workdir: Path) -> ModelSpec:
    """A tiny Llama from a config (saved with the built-in tokenizer), or SmolLM2-135M."""
    from transformers import AutoModelForCausalLM

    from areal_m2po.engine.builtin_models import build_tiny_llama

    if name in TINY_SIZES:
        from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

        tok = build_tiny_tokenizer()
        hidden, layers, heads, kv, inter, vocab = TINY_SIZES[name]
        model = build_tiny_llama(
            vocab or len(tok),
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=2048,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = tok.pad_token_id
        path = workdir / f"model-{name}"
        model.save_pretrained(path, safe_serialization=True)
        tok.save_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return _spec_from_model(name, model, str(path), (24, 40) if vocab is None else (30, 44))
    if name == "smollm2":
        from areal_m2po.engine.builtin_models import resolve_model_path

        path = resolve_model_path("builtin:smollm2-135m-instruct")
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.float32, attn_implementation="sdpa"
        )
        return _spec_from_model(name, model, path, (30, 44))
    raise SystemExit(f"unknown size {name!r}: use {', '.join(TINY_SIZES)} or smollm2")


def synthetic_batch(
    spec: ModelSpec, n_prompts: int, n_samples: int, max_new: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Left-padded prompts, completions from one column, right padding after EOS; behaviour and
    proximal log-probs that differ (so M2PO masks tokens); non-zero group advantages."""
    g = torch.Generator().manual_seed(seed)
    n = n_prompts * n_samples
    lo, hi = spec.prompt_len
    p_lens = torch.randint(lo, hi + 1, (n_prompts,), generator=g).repeat_interleave(n_samples)
    c_lens = torch.randint(max(1, max_new // 4), max_new + 1, (n,), generator=g)
    c_lens[0] = max_new
    p_max = int(p_lens.max())
    t = p_max + max_new
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    loss = torch.zeros(n, t, dtype=torch.bool)
    for i in range(n):
        p, c = int(p_lens[i]), int(c_lens[i])
        ids[i, p_max - p : p_max + c] = torch.randint(3, spec.vocab, (p + c,), generator=g)
        attn[i, p_max - p : p_max + c] = True
        loss[i, p_max : p_max + c] = True
    behave = -torch.rand(n, t, generator=g) * 3.0 * loss
    prox = (behave + 0.3 * torch.randn(n, t, generator=g)) * loss
    rewards = torch.rand(n, generator=g)
    adv = group_normalize(rewards, group_size=n_samples)
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "behave_logp": behave,
        "prox_logp": prox,
        "versions": torch.where(loss, 0, -1),
        "rewards": rewards,
        "no_eos": torch.zeros(n, dtype=torch.bool),
        "advantages": adv[:, None] * loss,
    }


def update_flops(spec: ModelSpec, batch: dict[str, torch.Tensor]) -> float:
    """Forward + backward (3 x forward) model FLOPs on the real tokens, padding not counted."""
    lengths = batch["attention_mask"].sum(-1).double()
    n_tokens = float(lengths.sum())
    n_scored = float(batch["loss_mask"].sum())
    dense = 2.0 * spec.matmul_params * n_tokens
    attn = 2.0 * spec.layers * spec.q_dim * float((lengths * (lengths + 1)).sum())  # causal
    head = 2.0 * spec.hidden * spec.vocab * n_scored
    return 3.0 * (dense + attn + head)
