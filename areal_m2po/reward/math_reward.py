"""Verifiable math rewards: answer extraction and a 0/1 correctness reward.

The common case (a numeric answer such as GSM8K's ``#### 72`` or the built-in
arithmetic task) is decided with plain string and :class:`~decimal.Decimal`
arithmetic.  Only when one side is not a number (e.g. LaTeX ``\\frac{1}{2}``)
does :func:`math_reward_fn` fall back to ``math_verify``, if it is installed.
"""

from __future__ import annotations

import re
import threading
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["extract_answer", "extract_ground_truth", "math_reward_fn", "normalise_number"]

# A number: optional minus (not glued to a preceding word/number, so "5-3" yields "3"),
# an integer part with or without thousands separators, an optional decimal part.
_NUMBER_RE = re.compile(
    r"(?:(?<![\w)\]])[-\u2212])?"  # sign: ASCII hyphen or Unicode minus
    r"(?<![\d.])"  # do not start inside another number
    r"(?:\d{1,3}(?:,\d{3})+|\d+)"  # 1,234,567 or 1234567
    r"(?:\.\d+)?"  # decimals; a trailing sentence period is never captured
    r"(?!\d)"
)
_FULL_NUMBER_RE = re.compile(r"[-\u2212]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-\u2212]?\.\d+")
_HASHES = "####"
_BOXED = "\\boxed"


def normalise_number(text: str) -> str | None:
    """Canonical string of a number written as ``text``, or None if it is not one number.

    Thousands separators, surrounding ``$``/spaces and a trailing period are removed;
    integral values lose their decimal part (``"72.0"`` → ``"72"``), other values lose
    trailing zeros (``"2.50"`` → ``"2.5"``); ``"-0"`` becomes ``"0"``.
    """
    stripped = text.strip().strip("$").strip().rstrip(".").strip()
    if not _FULL_NUMBER_RE.fullmatch(stripped):
        return None
    try:
        value = Decimal(stripped.replace(",", "").replace("\u2212", "-"))
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def _last_number(text: str) -> str | None:
    """The last number in ``text``, normalised, or None."""
    matches = _NUMBER_RE.findall(text)
    return normalise_number(matches[-1]) if matches else None


def _first_number(text: str) -> str | None:
    """The first number in ``text``, normalised, or None."""
    match = _NUMBER_RE.search(text)
    return normalise_number(match.group(0)) if match else None


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None.

    An unterminated box (the completion was cut off) is ignored.
    """
    start = text.rfind(_BOXED + "{")
    while start != -1:
        depth = 0
        open_at = start + len(_BOXED)
        for pos in range(open_at, len(text)):
            char = text[pos]
            if char == "{":
                depth += 1
            elif char == "}":
                depth -= 1
                if depth == 0:
                    return text[open_at + 1 : pos].strip()
        start = text.rfind(_BOXED + "{", 0, start)
    return None


def _canonical(content: str) -> str:
    """A boxed or ``####`` answer: its number when it is one number, else the stripped text."""
    number = normalise_number(content)
    return number if number is not None else content.strip()


def extract_answer(text: str) -> str | None:
    """The answer a completion gives, normalised, or None when it gives none.

    Priority: the number after the last ``####`` (if nothing numeric follows, the rest of
    that line as text); else the content of the last ``\\boxed{...}`` (nested braces
    allowed; a number inside is normalised); else the last number in the text.
    Numbers may be negative, decimal or use thousands separators (``1,234`` → ``"1234"``).
    """
    if _HASHES in text:
        tail = text[text.rfind(_HASHES) + len(_HASHES) :]
        number = _first_number(tail)
        if number is not None:
            return number
        first_line = tail.strip().split("\n", 1)[0].strip()
        if first_line:
            return first_line
    boxed = _last_boxed(text)
    if boxed:
        return _canonical(boxed)
    return _last_number(text)


def extract_ground_truth(answer: str) -> str | None:
    """Normalise a reference answer: GSM8K style (``... #### 72``), boxed, or plain."""
    if _HASHES in answer or _BOXED in answer:
        return extract_answer(answer)
    stripped = answer.strip()
    return _canonical(stripped) if stripped else None


def _math_verify_equal(candidates: list[str], truth: str) -> bool:
    """Whether any candidate text equals ``truth`` symbolically, through ``math_verify``.

    Any math_verify failure, and a missing package, count as not equal.
    """
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    # math_verify's own timeouts use SIGALRM, which only works in the main thread;
    # elsewhere the caller (RewardRunner) is responsible for the deadline.
    in_main = threading.current_thread() is threading.main_thread()
    parse_timeout = 5 if in_main else None
    try:
        gold = parse(f"${truth}$", parsing_timeout=parse_timeout)
        if not gold:
            return False
        for candidate in candidates:
            pred = parse(candidate, parsing_timeout=parse_timeout)
            if pred and verify(gold, pred, timeout_seconds=parse_timeout):
                return True
    except Exception:  # noqa: BLE001 - math_verify errors count as a wrong answer
        return False
    return False


def math_reward_fn(prompt: str, completion: str, answer: str, **kwargs: Any) -> float:
    """1.0 when ``completion`` states the reference ``answer``, else 0.0.

    Numbers are compared by value (``72`` == ``72.0``, ``1,234`` == ``1234``) without
    calling ``math_verify``; otherwise equal strings match, and as a last resort
    ``math_verify`` decides, on the extracted answer and then on the whole completion
    (errors count as 0.0).  ``prompt`` and extra keyword
    arguments are accepted for the common reward signature and ignored.
    """
    del prompt, kwargs
    truth = extract_ground_truth(str(answer))
    if truth is None:
        return 0.0
    truth_num = normalise_number(truth)
    prediction = extract_answer(completion)
    if prediction is None:
        if truth_num is not None:
            return 0.0  # no number anywhere in the completion: cannot match a number
        return 1.0 if _math_verify_equal([completion], truth) else 0.0
    pred_num = normalise_number(prediction)
    if truth_num is not None and pred_num is not None:
        return 1.0 if Decimal(truth_num) == Decimal(pred_num) else 0.0
    if prediction == truth:
        return 1.0
    return 1.0 if _math_verify_equal([f"${prediction}$", completion], truth) else 0.0
