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


def always_zero(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    """Scores every sample 0 without failing: no signal, but nothing wrong with the function."""
    return 0.0


async def async_reward(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    """An ``async def`` reward: refused when ``reward.path`` loads."""
    return 1.0


def two_args(prompt: str, completion: str) -> float:
    """Takes no answer: refused when ``reward.path`` loads."""
    return 1.0


def returns_nan(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    return float("nan")


def returns_none(prompt: str, completion: str, answer: str, **kwargs: object) -> None:
    return None


def returns_string(prompt: str, completion: str, answer: str, **kwargs: object) -> str:
    return "1.0"


def areal_digit_count(prompt, completions, prompt_ids, completion_ids, answer, **kwargs) -> float:
    """AReaL's signature: the completion's digit share, plus 1 when the completion's token
    count is what the ids say (so a run that passes the ids gets rewards in [1, 2])."""
    if not isinstance(prompt_ids, list) or not isinstance(completion_ids, list):
        raise TypeError("token ids must be lists")
    digits = sum(ch.isdigit() for ch in completions) / max(len(completions), 1)
    return digits + (1.0 if completion_ids and prompt_ids else 0.0)


def gated_digit_fraction(prompt: str, completion: str, answer: str, **kwargs: object) -> float:
    """:func:`digit_fraction` once the file named by ``$REWARD_GATE`` exists (the flood test
    opens its gate when its flood is in place; at most 300 s, then 0)."""
    import os
    import time

    deadline = time.monotonic() + 300
    while not os.path.exists(os.environ["REWARD_GATE"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return digit_fraction(prompt, completion, answer)
