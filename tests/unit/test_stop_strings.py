"""Stop strings matched on each row's decoded tail (issue 57): a row ends at the token that
completes a stop string, wherever the string started, and only the generated columns count."""

from __future__ import annotations

import torch
from agentic_helpers import tiny_model_and_tokenizer

from areal_m2po.rollout.engines.stop_strings import TailStopStrings, unmatchable_stop


def test_a_row_ends_at_the_token_completing_a_stop_string():
    tokenizer = tiny_model_and_tokenizer()[1]
    text = "hello world, hello there"
    ids = tokenizer.encode(text, add_special_tokens=False)
    stop = "o world, h"  # 10 characters, longer than the first window tries for short strings
    matcher = TailStopStrings(tokenizer, ["zz", stop])
    ends = [k for k in range(1, len(ids) + 1) if matcher.row_done(ids[:k])]
    first = next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))
    assert ends and ends[0] == first
    assert not matcher.row_done(ids[: first - 1])


def test_the_criterion_reads_only_the_generated_columns():
    tokenizer = tiny_model_and_tokenizer()[1]
    prompt = tokenizer.encode("stop", add_special_tokens=False)
    generated = tokenizer.encode("go on", add_special_tokens=False)
    matcher = TailStopStrings(tokenizer, ["stop"])
    rows = torch.tensor([prompt + generated[:1]])
    assert not bool(matcher(rows, None)[0])  # the prompt's "stop" does not end the row
    rows = torch.tensor([prompt + generated])
    assert not bool(matcher(rows, None)[0])


def test_a_string_the_tokenizer_cannot_produce_is_named():
    tokenizer = tiny_model_and_tokenizer()[1]
    assert unmatchable_stop(tokenizer, ["ok", "\u20ac"]) == "\u20ac"
    assert unmatchable_stop(tokenizer, ["ok", "a b"]) is None
