"""Dataset loading, prompt building, resumable batching and the built-in arithmetic task."""

from areal_m2po.dataset.arithmetic import (
    DEFAULT_TEST_SIZE,
    N_TEST_PAIRS,
    PARTITION_SEED,
    arithmetic_question,
    make_arithmetic_split,
)
from areal_m2po.dataset.loader import (
    PromptLoader,
    build_prompts,
    load_prompt_dataset,
    load_records,
)

__all__ = [
    "DEFAULT_TEST_SIZE",
    "N_TEST_PAIRS",
    "PARTITION_SEED",
    "PromptLoader",
    "arithmetic_question",
    "build_prompts",
    "load_prompt_dataset",
    "load_records",
    "make_arithmetic_split",
]
