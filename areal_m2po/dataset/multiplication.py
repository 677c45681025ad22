"""The built-in tool-use task: three-digit times two-digit multiplication, with a calculator.

All 900 x 90 = 81000 ordered pairs ``(a, b)`` with ``100 <= a <= 999`` and ``10 <= b <= 99``
are permuted once with :data:`MULTIPLICATION_PARTITION_SEED`; the first
:data:`N_MULTIPLICATION_TEST_PAIRS` form the test split and the rest the train split. The
question tells the model how to call the calculator tool of
:mod:`areal_m2po.rollout.workflows.multi_turn.tool_env` (``<calc>expression</calc>``), which
a small model needs: it cannot multiply such numbers in its head, and can with the tool.
"""

from __future__ import annotations

import random
from typing import Literal

__all__ = [
    "MULTIPLICATION_PARTITION_SEED",
    "N_MULTIPLICATION_TEST_PAIRS",
    "make_multiplication_split",
    "multiplication_question",
]

MULTIPLICATION_PARTITION_SEED = 20_261_202
"""Seed of the train/test partition; changing it changes every run's test set."""
N_MULTIPLICATION_TEST_PAIRS = 1024
"""Number of pairs reserved for the test split."""
_DEFAULT_TEST_SIZE = 256
_FIRST = range(100, 1000)
_SECOND = range(10, 100)


def multiplication_question(a: int, b: int) -> str:
    """The prompt text for ``a * b``, with the calculator's calling convention."""
    return (
        f"What is {a} * {b}? You have a calculator: write the expression between calc tags, "
        "for example <calc>12*34</calc>, and you will be told the result. Then reply with only "
        "the number."
    )


def make_multiplication_split(
    split: Literal["train", "test"], n: int | None = None, seed: int = 0
) -> list[dict[str, str]]:
    """Records ``{"question": ..., "answer": str(a * b)}`` of one split.

    Args:
        split: ``"train"`` (79976 pairs) or ``"test"`` (1024 pairs).
        n: how many records; None means all train pairs, or the first 256 test pairs.
        seed: shuffles the train split before taking ``n``; the test split keeps its order.

    Raises:
        ValueError: unknown split, or ``n`` outside ``1..len(split)``.
    """
    pairs = [(a, b) for a in _FIRST for b in _SECOND]
    random.Random(MULTIPLICATION_PARTITION_SEED).shuffle(pairs)
    if split == "test":
        pairs = pairs[:N_MULTIPLICATION_TEST_PAIRS]
        n = _DEFAULT_TEST_SIZE if n is None else n
    elif split == "train":
        pairs = pairs[N_MULTIPLICATION_TEST_PAIRS:]
        random.Random(seed).shuffle(pairs)
        n = len(pairs) if n is None else n
    else:
        raise ValueError(f"builtin:multiplication has splits 'train' and 'test', got {split!r}")
    if not 1 <= n <= len(pairs):
        raise ValueError(
            f"builtin:multiplication {split} split has {len(pairs)} problems, asked for n={n}"
        )
    return [{"question": multiplication_question(a, b), "answer": str(a * b)} for a, b in pairs[:n]]
