"""Tiny teacher models for the on-policy distillation tests (``tests/support`` is on pytest's
pythonpath): ``builtin:tiny``'s architecture with other weights, saved with a tokenizer."""

from __future__ import annotations

from pathlib import Path

import torch

from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


def save_tiny_teacher(
    path: Path, seed: int = 7, sharpness: float = 8.0, tokenizer=None, vocab_size=None
) -> Path:
    """A tiny Llama drawn with ``seed`` whose logits are ``sharpness`` times larger than its
    initialisation's (the final norm's weight scaled), so its next-token distributions are far
    from the near-uniform student's; saved with ``tokenizer`` (default: the tiny one; False: no
    tokenizer files) into ``path``. ``vocab_size``: the output layer's size (default: the
    tokenizer's)."""
    tok = build_tiny_tokenizer() if tokenizer is None else tokenizer
    size = vocab_size if vocab_size is not None else len(build_tiny_tokenizer())
    model = build_tiny_llama(size, seed=seed)
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpness)
    ref = build_tiny_tokenizer()
    model.config.eos_token_id = ref.eos_token_id
    model.config.pad_token_id = ref.pad_token_id
    model.save_pretrained(path, safe_serialization=True)
    if tok is not False:
        tok.save_pretrained(path)
    return path
