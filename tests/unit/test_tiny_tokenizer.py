"""Tests for the locally built character-level ChatML tokenizer."""

from __future__ import annotations

import pytest

from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

PROMPT = "What is 59 + 63? Reply with only the number."


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_round_trip_and_small_vocab() -> None:
    tok = build_tiny_tokenizer()
    ids = tok(PROMPT)["input_ids"]
    assert len(ids) == len(PROMPT)  # one token per character, no added specials
    assert tok.decode(ids) == PROMPT
    assert len(tok) < 128
    text = "line one\nline ~two~ {x}"
    assert tok.decode(tok(text)["input_ids"]) == text


def test_ids_are_deterministic() -> None:
    assert (
        build_tiny_tokenizer()(PROMPT)["input_ids"] == build_tiny_tokenizer()(PROMPT)["input_ids"]
    )
    tok = build_tiny_tokenizer()
    assert tok.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "\n", " "]
    ) == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_special_token_ids() -> None:
    tok = build_tiny_tokenizer()
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token_id == tok.eos_token_id == 2
    assert tok.bos_token_id == tok.unk_token_id == 0
    assert tok("<|im_start|>hi<|im_end|>")["input_ids"] == [1, *tok("hi")["input_ids"], 2]
    assert tok("\u00e9")["input_ids"] == [tok.unk_token_id]
    assert tok.decode([1, *tok("ok")["input_ids"], 2], skip_special_tokens=True) == "ok"


def test_chat_template() -> None:
    tok = build_tiny_tokenizer()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    )
    no_gen = tok.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert no_gen == f"<|im_start|>user\n{PROMPT}<|im_end|>\n"
    encoded = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = encoded["input_ids"] if not isinstance(encoded, list) else encoded
    assert ids == tok(text)["input_ids"]


def test_save_and_reload(tmp_path) -> None:
    from transformers import AutoTokenizer

    tok = build_tiny_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    chat = [{"role": "user", "content": PROMPT}]
    assert loaded(PROMPT)["input_ids"] == tok(PROMPT)["input_ids"]
    assert loaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    )
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.bos_token_id) == (2, 2, 0)
    assert len(loaded) == len(tok)
