"""A safe calculator for tool-use episodes: exact arithmetic on a parsed expression, no eval().

The expression is parsed with :mod:`ast` and only integer or decimal literals, ``+ - * /``,
unary ``+``/``-`` and parentheses are allowed; the size of the input, its nesting depth and
every intermediate value are bounded, so a model can never make the trainer slow or crash it.
Arithmetic is exact (:class:`fractions.Fraction`); results are written as integers when
integral, else as a decimal rounded to :data:`DECIMALS` places.
"""

from __future__ import annotations

import ast
import math
from decimal import Decimal
from fractions import Fraction

__all__ = ["DECIMALS", "MAX_ABS_VALUE", "MAX_EXPRESSION_CHARS", "CalculatorError", "calculate"]

MAX_EXPRESSION_CHARS = 200
"""Longest expression accepted, in characters."""
MAX_DEPTH = 32
"""Deepest syntax tree accepted (nested parentheses / operators)."""
MAX_ABS_VALUE = Fraction(10) ** 30
"""Largest magnitude of any literal, intermediate or final value."""
DECIMALS = 6
"""Decimal places of a non-integral result."""

_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class CalculatorError(ValueError):
    """A tool call the calculator refuses; the message is what the environment replies."""


def _checked(value: Fraction) -> Fraction:
    if abs(value) > MAX_ABS_VALUE:
        raise CalculatorError("number too large")
    return value


def _evaluate(node: ast.AST, depth: int) -> Fraction:
    if depth > MAX_DEPTH:
        raise CalculatorError("expression nested too deeply")
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, depth + 1)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalculatorError(f"unsupported literal {node.value!r}")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise CalculatorError("number too large")
        return _checked(Fraction(Decimal(repr(node.value))))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand, depth + 1)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left = _evaluate(node.left, depth + 1)
        right = _evaluate(node.right, depth + 1)
        if isinstance(node.op, ast.Div) and right == 0:
            raise CalculatorError("division by zero")
        return _checked(_BINARY[type(node.op)](left, right))
    raise CalculatorError(f"unsupported syntax ({type(node).__name__}); use numbers, + - * / ( )")


def _format(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    rounded = round(Decimal(value.numerator) / Decimal(value.denominator), DECIMALS)
    text = format(rounded.normalize(), "f")
    return "0" if text in ("-0", "") else text


def calculate(expression: str) -> str:
    """The value of ``expression`` as text, e.g. ``"37*45"`` -> ``"1665"``, ``"1/4"`` -> ``"0.25"``.

    ``x`` and ``×`` are read as ``*``, ``÷`` as ``/``; thousands separators are not numbers.

    Raises:
        CalculatorError: empty, too long, not an arithmetic expression, division by zero, or a
            value beyond :data:`MAX_ABS_VALUE`; the message says which.
    """
    text = expression.strip().replace("×", "*").replace("x", "*").replace("÷", "/")
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    if "**" in text:
        raise CalculatorError("unsupported operator **; use numbers, + - * / ( )")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        raise CalculatorError("not an arithmetic expression") from None
    return _format(_evaluate(tree, 0))
