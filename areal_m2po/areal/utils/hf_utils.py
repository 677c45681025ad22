"""AReaL's ``areal.utils.hf_utils`` tokenizer helpers (areal-project/AReaL cbff54d6):
:func:`load_hf_tokenizer` (a pad token set to EOS when missing; this trainer's
``builtin:`` model names resolve too) and :func:`apply_chat_template` (token ids as a plain
list whatever the transformers version returns)."""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["apply_chat_template", "load_hf_tokenizer"]


def apply_chat_template(
    tokenizer: Any, messages: list[dict[str, Any]], *, tokenize: bool = True, **kwargs: Any
) -> Any:
    """``tokenizer.apply_chat_template(messages, tokenize=tokenize, **kwargs)``; with
    ``tokenize`` a ``list[int]`` (newer transformers return a dict of ``input_ids``)."""
    result = tokenizer.apply_chat_template(messages, tokenize=tokenize, **kwargs)
    if tokenize and hasattr(result, "keys") and "input_ids" in result:
        return list(result["input_ids"])
    return result


@functools.lru_cache(maxsize=8)
def load_hf_tokenizer(
    model_name_or_path: str, fast_tokenizer: bool = True, padding_side: str | None = None
) -> Any:
    """The tokenizer at ``model_name_or_path`` (``padding_side`` set when given; a missing pad
    token becomes the EOS token). Cached per arguments, as AReaL's is."""
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path

    kwargs: dict[str, Any] = {} if padding_side is None else {"padding_side": padding_side}
    tokenizer = AutoTokenizer.from_pretrained(
        resolve_model_path(model_name_or_path), use_fast=fast_tokenizer, **kwargs
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = tokenizer.eos_token_id
    return tokenizer
