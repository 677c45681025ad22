"""A custom reward function for ``examples/custom_reward.yaml``.

A reward function is any importable callable with this signature::

    fn(prompt: str, completion: str, answer: str, **extra) -> float

and the config names it by dotted path, ``reward.path: my_reward:closeness_reward``. The module
must be importable by the training process: put its directory on ``PYTHONPATH`` (here
``PYTHONPATH=examples``), install it, or keep it inside your own package.

The trainer calls it from a few worker threads (``reward.max_workers``), so it must be
thread-safe; a call that raises, returns a non-finite value or runs longer than
``reward.timeout_s`` scores 0 and is counted in ``reward/n_errors``, ``reward/n_invalid`` or
``reward/n_timeouts``.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from areal_m2po.reward import extract_answer, extract_ground_truth


def closeness_reward(prompt: str, completion: str, answer: str, **extra: Any) -> float:
    """1 for the right number, partial credit for a near miss, 0 when no number is given.

    A wrong number scores ``0.5 * max(0, 1 - |guess - truth| / max(|truth|, 1))``: answering
    121 to ``59 + 63`` (122) earns about 0.5, answering 61 about 0.25, answering 0 nothing. It
    shows the hook; it is not a recommended reward (a model can farm the partial credit).
    """
    guess, truth = extract_answer(completion), extract_ground_truth(answer)
    if guess is None or truth is None:
        return 0.0
    try:
        g, t = Decimal(guess), Decimal(truth)
    except ArithmeticError:  # not numbers (e.g. LaTeX): exact text match only
        return 1.0 if guess == truth else 0.0
    if g == t:
        return 1.0
    relative_error = abs(g - t) / max(abs(t), Decimal(1))
    return float(max(Decimal(0), 1 - relative_error) / 2)
