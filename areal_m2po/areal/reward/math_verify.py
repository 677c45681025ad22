"""Answer checking with ``math_verify`` as AReaL's reward functions do it (areal-project/AReaL
cbff54d6, ``areal/reward/__init__.py``, ``gsm8k.py``, ``geometry3k.py``).

:class:`MathVerifyWorker` parses both texts with an expression and a LaTeX extractor and
compares them to ``precision`` significant digits; parsing and comparison run with
``math_verify``'s signal-based timeouts off (they only work on the main thread) and, when
``timeout`` is set, under a thread-pool deadline instead. Any failure or timeout scores 0.0.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import re
from typing import Any

__all__ = [
    "MathVerifyWorker",
    "extract_bracketed_answer",
    "geometry3k_reward_fn",
    "get_math_verify_worker",
    "gsm8k_reward_fn",
]

logger = logging.getLogger("areal_m2po.areal.reward")

_BRACKETED = re.compile(r"\[([^\]]+)\]")
_NUMBER = re.compile(r"-?\d*\.?\d+")


class MathVerifyWorker:
    """``math_verify`` with AReaL's extraction set-up.

    Args:
        try_extract_without_anchor: also take a bare number anywhere in the text (False: only
            anchored ones such as ``answer = 1``).
        precision: significant digits that must agree.
        timeout: seconds for one :meth:`verify` (parsing and comparison); None: no limit.
    """

    def __init__(
        self,
        try_extract_without_anchor: bool = True,
        precision: int = 6,
        timeout: float | None = 5.0,
    ) -> None:
        from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

        def targets() -> tuple[Any, ...]:
            expr = ExprExtractionConfig(try_extract_without_anchor=try_extract_without_anchor)
            return (expr, LatexExtractionConfig())

        self.gold_extraction_target = targets()
        self.pred_extraction_target = targets()
        self.precision = precision
        self.timeout = timeout

    def _verify_impl(self, response: str, ground_truth: str) -> float:
        """1.0 when both texts parse and ``math_verify`` finds them equal, else 0.0."""
        from math_verify.grader import verify
        from math_verify.parser import parse

        gold = parse(
            ground_truth, extraction_config=self.gold_extraction_target, parsing_timeout=None
        )
        pred = parse(response, extraction_config=self.pred_extraction_target, parsing_timeout=None)
        if not gold or not pred:
            return 0.0
        same = verify(gold, pred, float_rounding=self.precision, timeout_seconds=None)
        return 1.0 if same else 0.0

    def verify(self, response: str, ground_truth: str) -> float:
        """1.0 when ``response``'s answer equals ``ground_truth``'s; 0.0 otherwise, on an
        error or past ``timeout`` (a warning logged)."""
        try:
            if self.timeout is None:
                return self._verify_impl(response, ground_truth)
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                future = pool.submit(self._verify_impl, response, ground_truth)
                return future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            logger.warning(
                "math_verify took over %ss on response=%r ground_truth=%r; scoring 0.0",
                self.timeout,
                response[:200],
                ground_truth[:200],
            )
        except Exception:  # noqa: BLE001 - a checker failure scores 0, as in AReaL
            logger.warning("math_verify failed; scoring 0.0", exc_info=True)
        return 0.0


@functools.lru_cache(maxsize=1)
def get_math_verify_worker() -> MathVerifyWorker:
    """The process's shared :class:`MathVerifyWorker` with AReaL's defaults."""
    return MathVerifyWorker()


def gsm8k_reward_fn(
    prompt: Any, completions: Any, prompt_ids: Any, completion_ids: Any, answer: Any, **kwargs: Any
) -> float:
    """AReaL's GSM8K reward: 1.0 when the completion's answer equals ``answer`` (``math_verify``
    on both texts), else 0.0 (also on any error)."""
    try:
        return get_math_verify_worker().verify(str(completions), str(answer))
    except Exception:  # noqa: BLE001 - as AReaL: a failure scores 0
        logger.warning("gsm8k_reward_fn failed; scoring 0.0", exc_info=True)
        return 0.0


def extract_bracketed_answer(text: str, use_last_number: bool = True) -> str:
    """The last ``[...]`` group's content of ``text``; without one, its last number (commas
    dropped) when ``use_last_number``; else ``""``."""
    groups = _BRACKETED.findall(text)
    if groups:
        return groups[-1]
    if use_last_number:
        numbers = _NUMBER.findall(text.replace(",", ""))
        if numbers:
            return numbers[-1]
    return ""


def geometry3k_reward_fn(
    prompt: Any, completions: Any, prompt_ids: Any, completion_ids: Any, answer: Any, **kwargs: Any
) -> float:
    """AReaL's Geometry3K reward: the completion's bracketed (or last-number) answer against
    the reference's (or the whole reference when it has none), with ``math_verify``."""
    try:
        predicted = extract_bracketed_answer(str(completions))
        reference = extract_bracketed_answer(str(answer)) or str(answer)
        if not predicted or not reference:
            return 0.0
        return get_math_verify_worker().verify(predicted, reference)
    except Exception:  # noqa: BLE001 - as AReaL: a failure scores 0
        logger.warning("geometry3k_reward_fn failed; scoring 0.0", exc_info=True)
        return 0.0
