"""Preference pairs as language-model examples for DPO: each pair becomes two token rows, the
prompt followed by the chosen completion and by the rejected one, with a loss mask on the
completion's tokens.

Records are those of :func:`areal_m2po.dataset.preference.load_preference_records` with
``conversational=True``. A pair of strings is rendered as SFT renders a prompt/completion
record (:func:`areal_m2po.dataset.sft.tokenize_sft_example`): with the chat template, one user
and one assistant turn, the assistant turn's tokens learned (its end-of-turn token included);
without one, ``prompt + completion`` plus EOS. A conversational pair (any field a list of
turns; a string prompt is then one user turn and a string completion one assistant turn) is
rendered as the conversation ``prompt turns + completion turns``; only the assistant turns of
the completion are learned, those of the prompt are context.

Bad input is a one-line ``ValueError`` naming the pair's file and line, before any model loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from areal_m2po.dataset.loader import _has_chat_template
from areal_m2po.dataset.sft import _chat_example, collate_sft, tokenize_sft_example

__all__ = ["collate_dpo", "tokenize_dpo_completion", "tokenize_dpo_pairs"]

Turns = list[dict[str, str]]


def _as_turns(value: str | Turns, role: str) -> Turns:
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def tokenize_dpo_completion(
    prompt: str | Turns,
    completion: str | Turns,
    tokenizer: Any,
    use_chat_template: bool = True,
    where: str = "record",
) -> tuple[list[int], list[bool]]:
    """``(input_ids, loss_mask)`` of ``prompt`` followed by ``completion`` (see the module
    docstring); the mask is True on the completion's learned tokens.

    Raises:
        ValueError: a conversational pair without a chat template to render it.
    """
    if isinstance(prompt, str) and isinstance(completion, str):
        record = {"prompt": prompt, "completion": completion, "where": where}
        return tokenize_sft_example(record, tokenizer, use_chat_template)
    if not (use_chat_template and _has_chat_template(tokenizer)):
        raise ValueError(
            f"{where}: a conversational pair (a list of turns) needs the tokenizer's chat "
            "template (the tokenizer has none or use_chat_template is false)"
        )
    context = _as_turns(prompt, "user")
    return _chat_example(
        tokenizer, context + _as_turns(completion, "assistant"), where, len(context)
    )


def tokenize_dpo_pairs(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    max_length: int,
    use_chat_template: bool = True,
) -> list[dict[str, Any]]:
    """``{"chosen": example, "rejected": example, "where"}`` per record, each example
    ``{"input_ids", "loss_mask"}`` (lists) as :func:`~areal_m2po.dataset.sft.collate_sft`
    takes it.

    Raises ``ValueError`` naming the record's file and line when the prompt with either
    completion is longer than ``max_length`` tokens (never cut), when a completion has no
    token to learn after the first, or when the two rows are the same tokens.
    """
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    out: list[dict[str, Any]] = []
    for record in records:
        where = str(record.get("where", "record"))
        pair: dict[str, Any] = {"where": where}
        for name in ("chosen", "rejected"):
            ids, mask = tokenize_dpo_completion(
                record["prompt"], record[name], tokenizer, use_chat_template, where
            )
            if len(ids) > max_length:
                raise ValueError(
                    f"{where}: prompt + {name} is {len(ids)} tokens, longer than "
                    f"max_length={max_length}"
                )
            mask[0] = False  # the first token has no prediction
            if not any(mask):
                raise ValueError(f"{where}: {name!r} has no completion token to learn from")
            pair[name] = {"input_ids": ids, "loss_mask": mask}
        if pair["chosen"] == pair["rejected"]:
            raise ValueError(f"{where}: 'chosen' and 'rejected' give the same tokens")
        out.append(pair)
    return out


def collate_dpo(pairs: Sequence[Mapping[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """The engine's batch layout of ``pairs`` (:func:`tokenize_dpo_pairs`): rows ``2i`` and
    ``2i + 1`` are pair ``i``'s chosen and rejected completions, laid out by
    :func:`~areal_m2po.dataset.sft.collate_sft` (``input_ids`` int64, ``attention_mask`` and
    ``loss_mask`` bool, ``[2P, T]``)."""
    rows = [pair[name] for pair in pairs for name in ("chosen", "rejected")]
    return collate_sft(rows, pad_id)
