"""Toy rewards for tiny-model tests (a random tiny model never solves arithmetic): dense, failing
and hanging ones."""

import threading


def digit_fraction(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    """Share of digit characters in the completion: varies between samples, so GRPO has signal."""
    if not completion:
        return 0.0
    return sum(ch.isdigit() for ch in completion) / len(completion)


def always_raises(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    raise RuntimeError("reward function failure for testing")


def hanging_reward(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    """Never answers within a test's timeout (the thread finishes later on its own)."""
    threading.Event().wait(1.5)
    return 1.0


def column_value(prompt: str, completion: str, answer: str, bonus: float) -> float:
    """The record's ``bonus`` column (a dataset column other than prompt and answer)."""
    return float(bonus)
