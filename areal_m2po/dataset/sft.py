"""Supervised fine-tuning examples: load, check, tokenize with a loss mask, and collate.

A record is either a conversation, ``{"messages": [{"role": ..., "content": ...}, ...]}``
(roles ``system``, ``user``, ``assistant``, ``tool`` (a tool's result, rendered as the chat
template renders that role); at least one assistant turn), whose assistant turns are learned; or a prompt and a completion, ``{"prompt": ..., "completion": ...}`` (TRL's
prompt-completion format), whose completion is learned. ``builtin:arithmetic`` gives the
built-in task's questions with their correct answers as completions. Sources are those of
prompt datasets (:func:`areal_m2po.dataset.loader.read_rows`).

With a chat template the example is rendered as the conversation (a prompt/completion record as
one user and one assistant turn, which is how PPO renders its prompts). The tokens of each
assistant turn are those the conversation gains between the template's generation prompt and
the end of the turn (its end-of-turn token included). Without a template (or
``use_chat_template=False``) a prompt/completion record becomes ``prompt + completion`` encoded
with the tokenizer's special tokens, and EOS is appended to the completion.

Bad input stops before any model loads, with a one-line ``ValueError`` that names the culprit's
file and line (or item/row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from areal_m2po.dataset.arithmetic import make_arithmetic_split
from areal_m2po.dataset.loader import (
    _as_id_list,
    _has_chat_template,
    _required_field,
    read_records,
)

__all__ = [
    "ROLES",
    "collate_sft",
    "load_sft_records",
    "tokenize_sft_example",
    "tokenize_sft_records",
]

ROLES = ("system", "user", "assistant", "tool")
_BUILTIN = "builtin:arithmetic"


def _check_messages(
    value: Any, field: str, where: str, need_assistant: bool = True
) -> list[dict[str, str]]:
    """A validated conversation (only ``role`` and ``content`` kept); with ``need_assistant``
    it must hold an assistant turn."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: field {field!r} must be a non-empty list of turns")
    turns: list[dict[str, str]] = []
    for i, turn in enumerate(value):
        at = f"{where}: {field}[{i}]"
        if not isinstance(turn, Mapping):
            raise ValueError(f"{at} must be an object with 'role' and 'content'")
        role = _required_field(turn, "role", at, string=True)
        content = _required_field(turn, "content", at, string=True)
        if role not in ROLES:
            raise ValueError(f"{at}: role must be one of {list(ROLES)}, got {role!r}")
        if role == "assistant" and not content.strip():
            raise ValueError(f"{at}: an assistant turn is empty")
        turns.append({"role": role, "content": content})
    if need_assistant and not any(t["role"] == "assistant" for t in turns):
        raise ValueError(f"{where}: field {field!r} has no assistant turn to learn from")
    return turns


def _check_record(
    raw: Any, where: str, prompt_field: str, completion_field: str, messages_field: str
) -> dict[str, Any]:
    """One validated record of a JSON object: ``{messages}`` or ``{prompt, completion}``, plus
    its ``where``."""
    if messages_field in raw and raw[messages_field] is not None:
        return {
            "messages": _check_messages(raw[messages_field], messages_field, where),
            "where": where,
        }
    hint = f" (an example needs {messages_field!r}, or {prompt_field!r} and {completion_field!r})"
    prompt = _required_field(raw, prompt_field, where, string=True, missing_hint=hint)
    completion = _required_field(raw, completion_field, where, string=True, missing_hint=hint)
    if not completion.strip():
        raise ValueError(f"{where}: field {completion_field!r} is empty")
    return {"prompt": prompt, "completion": completion, "where": where}


def load_sft_records(
    path: str,
    split: str = "train",
    max_samples: int | None = None,
    prompt_field: str = "prompt",
    completion_field: str = "completion",
    messages_field: str = "messages",
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Validated SFT records in file order, each with its ``where`` (``file:line``).

    ``builtin:arithmetic``: the built-in task's ``split`` (``max_samples`` problems, the train
    split shuffled by ``seed``), the answer as completion. Raises ``ValueError`` (one line naming
    file and line) for an unreadable source, a record with neither a conversation nor a
    prompt and completion, a bad turn, an empty completion, or no records.
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 or None, got {max_samples}")
    if path == _BUILTIN:
        rows = make_arithmetic_split(split, n=max_samples, seed=seed)  # type: ignore[arg-type]
        return [
            {"prompt": r["question"], "completion": r["answer"], "where": f"{path} {split} #{i}"}
            for i, r in enumerate(rows)
        ]
    if path.startswith("builtin:"):
        raise ValueError(f"unknown built-in dataset {path!r}; known: {_BUILTIN}")
    return read_records(
        path,
        split,
        max_samples,
        lambda row, where: _check_record(
            row, where, prompt_field, completion_field, messages_field
        ),
        "SFT dataset",
    )


def _render_ids(
    tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool
) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=generation_prompt
    )
    return _as_id_list(encoded)


def _chat_example(
    tokenizer: Any, messages: list[dict[str, str]], where: str, first_learned: int = 0
) -> tuple[list[int], list[bool]]:
    """Token ids of the conversation and the mask of its assistant tokens (those of the turns
    from index ``first_learned`` on; earlier assistant turns are context)."""
    ids: list[int] = []
    mask: list[bool] = []
    for k, turn in enumerate(messages):
        full = _render_ids(tokenizer, messages[: k + 1], False)
        if turn["role"] == "assistant" and k >= first_learned:
            head = _render_ids(tokenizer, messages[:k], True)
        else:
            head = full
        for part in (head, full):
            if part[: len(ids)] != ids:
                raise ValueError(
                    f"{where}: the chat template does not render turn {k} as an extension of "
                    "the turns before it; the assistant tokens cannot be located"
                )
        mask += [False] * (len(head) - len(ids)) + [True] * (len(full) - len(head))
        ids = full
    return ids, mask


def tokenize_sft_example(
    record: Mapping[str, Any], tokenizer: Any, use_chat_template: bool = True
) -> tuple[list[int], list[bool]]:
    """``(input_ids, loss_mask)`` of one record: the mask is True on the completion (assistant)
    tokens. See the module docstring for the layout.

    Raises:
        ValueError: a conversation without a chat template to render it.
    """
    where = str(record.get("where", "record"))
    chat = use_chat_template and _has_chat_template(tokenizer)
    if "messages" in record:
        if not chat:
            raise ValueError(
                f"{where}: a 'messages' conversation needs the tokenizer's chat template "
                "(the tokenizer has none or use_chat_template is false)"
            )
        return _chat_example(tokenizer, list(record["messages"]), where)
    if chat:
        messages = [
            {"role": "user", "content": record["prompt"]},
            {"role": "assistant", "content": record["completion"]},
        ]
        return _chat_example(tokenizer, messages, where)
    prompt = _as_id_list(tokenizer(record["prompt"])["input_ids"])
    completion = _as_id_list(tokenizer(record["completion"], add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        completion.append(int(tokenizer.eos_token_id))
    return prompt + completion, [False] * len(prompt) + [True] * len(completion)


def tokenize_sft_records(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    max_length: int,
    use_chat_template: bool = True,
) -> list[dict[str, Any]]:
    """``{"input_ids", "loss_mask", "where"}`` per record (lists).

    Raises ``ValueError`` naming the record's file and line when it is longer than
    ``max_length`` tokens (never cut), or has no completion token after its first token.
    """
    out: list[dict[str, Any]] = []
    for record in records:
        where = record.get("where", "record")
        ids, mask = tokenize_sft_example(record, tokenizer, use_chat_template)
        if len(ids) > max_length:
            raise ValueError(
                f"{where}: the example is {len(ids)} tokens, longer than max_length={max_length}"
            )
        mask[0] = False  # the first token has no prediction
        if not any(mask):
            raise ValueError(f"{where}: the example has no completion token to learn from")
        out.append({"input_ids": ids, "loss_mask": mask, "where": where})
    return out


def collate_sft(examples: Sequence[Mapping[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """A batch in the engine's layout (:mod:`areal_m2po.utils.data`) from tokenized examples.

    Each row is shifted right so that the first loss token of every row lands in one column
    ``P`` (the shortest prefix through the LM head in the padded forward), then padded on the
    right. Returns ``input_ids`` int64 ``[B, T]``, ``attention_mask`` and ``loss_mask`` bool
    ``[B, T]``. ``B = 0`` gives ``[0, 1]`` tensors.
    """
    if not examples:
        empty = torch.zeros(0, 1, dtype=torch.bool)
        return {
            "input_ids": torch.zeros(0, 1, dtype=torch.long),
            "attention_mask": empty,
            "loss_mask": empty.clone(),
        }
    firsts = [list(e["loss_mask"]).index(True) for e in examples]
    col = max(firsts)
    width = max(col - f + len(e["input_ids"]) for f, e in zip(firsts, examples))
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros(len(examples), width, dtype=torch.bool)
    loss = torch.zeros(len(examples), width, dtype=torch.bool)
    for row, (first, example) in enumerate(zip(firsts, examples)):
        start = col - first
        n = len(example["input_ids"])
        ids[row, start : start + n] = torch.tensor(example["input_ids"], dtype=torch.long)
        attn[row, start : start + n] = True
        loss[row, start : start + n] = torch.tensor(example["loss_mask"], dtype=torch.bool)
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}
