"""Preference pairs for reward-model training and DPO: load, check, render and tokenize them.

A record holds ``prompt``, ``chosen`` and ``rejected`` strings (TRL's explicit-prompt standard
preference format; without ``prompt``, the text ``chosen`` and ``rejected`` share from the start
is the prompt: hh-rlhf's layout, which AReaL's ``rw``/``dpo`` files read) and optionally
``margin``, a number: the reward gap the pair should have
(TRL's ``margin`` column). For DPO (``conversational=True``) the three fields may also be lists
of ``{role, content}`` turns (TRL's conversational format); :mod:`areal_m2po.dataset.dpo`
tokenizes them. Sources are those of prompt datasets
(:func:`areal_m2po.dataset.loader.read_rows`): a local ``.jsonl``/``.json``/``.parquet`` file or
a ``datasets`` directory.

The text a reward model scores is rendered by :func:`reward_model_text`, once for training here
and once for scoring rollouts in PPO (:mod:`areal_m2po.reward.reward_model`), so both see the
same layout: with a chat template, the user turn (the prompt) and the assistant turn (the
completion); without one, prompt and completion concatenated.

Every problem is raised as a ``ValueError`` whose message is one line naming the file and line
(or item/row) of the culprit, before any model loads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from areal_m2po.dataset.loader import (
    _as_id_list,
    _has_chat_template,
    _required_field,
    read_records,
)

__all__ = [
    "PREFERENCE_FIELDS",
    "encode_reward_model_text",
    "load_preference_records",
    "reward_model_text",
    "tokenize_preference_pairs",
]

PREFERENCE_FIELDS = ("prompt", "chosen", "rejected")
"""The fields a preference record must have (all strings; ``chosen``/``rejected`` non-empty)."""


def _check_turns(raw: Any, name: str, where: str) -> list[dict[str, str]]:
    """A conversational field: the prompt's turns, or a completion's (with an assistant turn)."""
    from areal_m2po.dataset.sft import _check_messages

    return _check_messages(raw[name], name, where, need_assistant=name != "prompt")


def _split_implicit_prompt(raw: Any, where: str) -> dict[str, Any]:
    """``raw`` with the turns ``chosen`` and ``rejected`` share from the start moved into
    ``prompt`` (TRL's implicit-prompt format: two whole conversations and no prompt)."""
    chosen, rejected = raw["chosen"], raw["rejected"]
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    if n == 0:
        raise ValueError(
            f"{where}: without a 'prompt', 'chosen' and 'rejected' must start with the same "
            "turns (the prompt)"
        )
    return {**raw, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def _split_implicit_text_prompt(raw: Any) -> dict[str, Any]:
    """``raw`` with the text ``chosen`` and ``rejected`` share from the start moved into
    ``prompt`` (hh-rlhf's layout, AReaL's ``type: rw``/``dpo`` data: two whole dialogues and
    no prompt), the cut moved back before the spaces it would leave at the prompt's end."""
    chosen, rejected = raw["chosen"], raw["rejected"]
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    while n > 0 and chosen[n - 1] == " ":
        n -= 1
    return {**raw, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


def _check_record(raw: Any, where: str, conversational: bool = False) -> dict[str, Any]:
    """One validated record ``{prompt, chosen, rejected[, margin]}`` (other fields dropped) of
    a JSON object; with ``conversational`` a field may also be a list of turns, and two whole
    conversations without a ``prompt`` share theirs as the prompt. Two texts without a
    ``prompt`` share theirs the same way (hh-rlhf's layout)."""
    whole = isinstance(raw.get("chosen"), list) and isinstance(raw.get("rejected"), list)
    if conversational and whole and "prompt" not in raw:
        raw = _split_implicit_prompt(raw, where)
    texts = isinstance(raw.get("chosen"), str) and isinstance(raw.get("rejected"), str)
    if texts and "prompt" not in raw and raw["chosen"] != raw["rejected"]:
        raw = _split_implicit_text_prompt(raw)
    record: dict[str, Any] = {}
    hint = f" (a pair needs {PREFERENCE_FIELDS})"
    for name in PREFERENCE_FIELDS:
        if conversational and isinstance(raw.get(name), list):
            record[name] = _check_turns(raw, name, where)
            continue
        value = _required_field(raw, name, where, string=not conversational, missing_hint=hint)
        if not isinstance(value, str):
            raise ValueError(
                f"{where}: field {name!r} must be a string or a list of turns, got "
                f"{type(value).__name__}"
            )
        if name != "prompt" and not value.strip():
            raise ValueError(f"{where}: field {name!r} is empty")
        record[name] = value
    if raw.get("margin") is not None:
        margin = raw["margin"]
        if isinstance(margin, bool) or not isinstance(margin, (int, float)):
            raise ValueError(f"{where}: field 'margin' must be a number, got {margin!r}")
        if not math.isfinite(float(margin)):
            raise ValueError(f"{where}: field 'margin' must be finite, got {margin!r}")
        record["margin"] = float(margin)
    if record["chosen"] == record["rejected"]:
        raise ValueError(f"{where}: 'chosen' and 'rejected' are the same text")
    record["where"] = where
    return record


def load_preference_records(
    path: str,
    split: str = "train",
    max_samples: int | None = None,
    config_name: str | None = None,
    conversational: bool = False,
) -> list[dict[str, Any]]:
    """Validated preference records, in file order; each keeps its ``where`` (``file:line``).

    ``max_samples`` keeps the first records. With ``conversational`` (DPO) ``prompt``,
    ``chosen`` and ``rejected`` may also be lists of ``{role, content}`` turns (TRL's
    conversational format; a completion needs an assistant turn), and a record may hold two
    whole conversations without a ``prompt`` (TRL's implicit prompt: the turns they share
    from the start). Raises ``ValueError`` (one line, naming file and line) for an unreadable
    source, a missing or non-string field, an empty ``chosen`` or ``rejected`` (or an empty
    assistant turn), identical ``chosen`` and ``rejected``, a bad ``margin``, or no records.
    """
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be >= 1 or None, got {max_samples}")
    return read_records(
        path,
        split,
        max_samples,
        lambda raw, where: _check_record(raw, where, conversational),
        "preference dataset",
        config_name,
    )


def reward_model_text(
    tokenizer: Any, prompt: str, completion: str, use_chat_template: bool = True
) -> tuple[str, bool]:
    """The text a reward model scores for ``prompt`` + ``completion``.

    Returns ``(text, add_special_tokens)``: with a chat template (and ``use_chat_template``) the
    rendered user + assistant turns, which already carry their special tokens (so
    ``add_special_tokens`` is False); otherwise ``prompt + completion`` encoded with the
    tokenizer's usual special tokens, as prompts without a template are.
    """
    if use_chat_template and _has_chat_template(tokenizer):
        messages = [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": completion},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        return str(text), False
    return prompt + completion, True


def encode_reward_model_text(
    tokenizer: Any, prompt: str, completion: str, use_chat_template: bool = True
) -> list[int]:
    """Token ids of :func:`reward_model_text`."""
    text, special = reward_model_text(tokenizer, prompt, completion, use_chat_template)
    return _as_id_list(tokenizer(text, add_special_tokens=special)["input_ids"])


def tokenize_preference_pairs(
    records: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    max_length: int,
    use_chat_template: bool = True,
) -> list[dict[str, Any]]:
    """Add ``chosen_ids`` and ``rejected_ids`` (token id lists) to copies of ``records``.

    Raises ``ValueError`` naming the record's file and line when the chosen or the rejected
    text is longer than ``max_length`` tokens (TRL's ``max_length``): a pair is never cut.
    """
    if max_length < 1:
        raise ValueError(f"max_length must be >= 1, got {max_length}")
    out: list[dict[str, Any]] = []
    for record in records:
        pair = dict(record)
        for name in ("chosen", "rejected"):
            ids = encode_reward_model_text(
                tokenizer, record["prompt"], record[name], use_chat_template
            )
            if len(ids) > max_length:
                raise ValueError(
                    f"{record.get('where', 'record')}: prompt + {name} is {len(ids)} tokens, "
                    f"longer than max_length={max_length}"
                )
            pair[f"{name}_ids"] = ids
        out.append(pair)
    return out
