"""The built-in demo task: two-digit addition, with fixed disjoint train and test splits.

All 90 × 90 = 8100 ordered pairs ``(a, b)`` with ``10 <= a, b <= 99`` are permuted once
with :data:`PARTITION_SEED`; the first :data:`N_TEST_PAIRS` form the test split and the
rest the train split, so every run evaluates on the same problems and never trains on
them.
"""

from __future__ import annotations

import random
from typing import Literal

__all__ = [
    "DEFAULT_TEST_SIZE",
    "N_TEST_PAIRS",
    "PARTITION_SEED",
    "arithmetic_question",
    "make_arithmetic_split",
]

PARTITION_SEED = 20_250_601
"""Seed of the train/test partition; changing it changes every run's test set."""
N_TEST_PAIRS = 512
"""Number of pairs reserved for the test split."""
DEFAULT_TEST_SIZE = 128
"""Test problems used when ``n`` is None."""
_OPERANDS = range(10, 100)


def arithmetic_question(a: int, b: int) -> str:
    """The prompt text for ``a + b``."""
    return f"What is {a} + {b}? Reply with only the number."


def _partition() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(test pairs, train pairs) from the fixed seeded permutation of all pairs."""
    pairs = [(a, b) for a in _OPERANDS for b in _OPERANDS]
    random.Random(PARTITION_SEED).shuffle(pairs)
    return pairs[:N_TEST_PAIRS], pairs[N_TEST_PAIRS:]


def make_arithmetic_split(
    split: Literal["train", "test"], n: int | None = None, seed: int = 0
) -> list[dict[str, str]]:
    """Records ``{"question": ..., "answer": str(a + b)}`` of one split.

    Args:
        split: ``"train"`` (7588 pairs) or ``"test"`` (512 pairs).
        n: how many records; None means all train pairs, or the first
            :data:`DEFAULT_TEST_SIZE` test pairs.
        seed: shuffles the train split before taking ``n``; the test split is always
            taken in its fixed order, so the evaluation set does not depend on it.

    Raises:
        ValueError: unknown split, or ``n`` outside ``1..len(split)``.
    """
    test_pairs, train_pairs = _partition()
    if split == "test":
        pairs = test_pairs
        if n is None:
            n = DEFAULT_TEST_SIZE
    elif split == "train":
        pairs = train_pairs
        random.Random(seed).shuffle(pairs)
        if n is None:
            n = len(pairs)
    else:
        raise ValueError(f"builtin:arithmetic has splits 'train' and 'test', got {split!r}")
    if not 1 <= n <= len(pairs):
        raise ValueError(
            f"builtin:arithmetic {split} split has {len(pairs)} problems, asked for n={n}"
        )
    return [{"question": arithmetic_question(a, b), "answer": str(a + b)} for a, b in pairs[:n]]
