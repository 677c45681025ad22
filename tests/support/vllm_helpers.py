"""Shared pieces of the vLLM tests: a tiny model vLLM's CPU attention runs, HF references.

``builtin:tiny`` has head size 16, which vLLM's CPU attention does not support; the vLLM tests
build the same tiny Llama with 2 heads of size 32 and the local character tokenizer.
"""

from __future__ import annotations

import os

import torch

from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

TINY_VLLM_CONFIG = {"head_dim": 32, "num_attention_heads": 2, "num_key_value_heads": 1}


def write_tiny_vllm_model(path: str, seed: int = 0, tied: bool = True, **config: object) -> str:
    """Save the tiny Llama (head size 32, tied embeddings unless ``tied=False``; ``config``:
    more ``LlamaConfig`` fields) and its tokenizer to ``path``; returns ``path``."""
    tok = build_tiny_tokenizer()
    model = build_tiny_llama(
        len(tok), seed=seed, tie_word_embeddings=tied, **TINY_VLLM_CONFIG, **config
    )
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def hf_token_logprobs(
    model: torch.nn.Module, prompt: list[int], output: list[int], temperature: float
) -> torch.Tensor:
    """``log softmax(logits / temperature)`` of each ``output`` token after ``prompt`` under
    ``model`` (a plain HF forward pass in float64, the independent reference) [len(output)]."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    p = len(prompt)
    step = logits[p - 1 : p - 1 + len(output)] / temperature
    return torch.log_softmax(step, -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


def perturbed_state(model: torch.nn.Module, scale: float, seed: int) -> dict[str, torch.Tensor]:
    """The model's ``state_dict`` with seeded Gaussian noise of std ``scale`` added to every
    tensor (a new policy version); a tied alias (``lm_head.weight`` sharing the embedding's
    storage) is left out, as a tied Hugging Face checkpoint leaves it out."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, value in model.state_dict().items():
        if value.data_ptr() in seen:
            continue
        seen.add(value.data_ptr())
        noise = torch.randn(value.shape, generator=gen, dtype=value.dtype)
        out[name] = value + scale * noise
    return out
