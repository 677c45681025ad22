"""Token ids <-> text for rollouts, without re-tokenising generated tokens.

:func:`encode_text` tokenises text that is appended after generated tokens (a chat template's
turn delimiters, a tool's reply); :func:`decode_completion` is the text a reward function
grades.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["decode_completion", "encode_text"]


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids without added special tokens (special-token text is kept as such)."""
    if not text:
        return []
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]


def decode_completion(tokenizer: Any, output_ids: Sequence[int], eos_ids: Sequence[int]) -> str:
    """The text of a completion: EOS tokens dropped, special tokens skipped."""
    eos = set(eos_ids)
    return tokenizer.decode([t for t in output_ids if t not in eos], skip_special_tokens=True)
