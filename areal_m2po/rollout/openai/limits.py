"""What one chat-completions call to the agent endpoint may hold, checked before any work.

The endpoint lives in the trainer's process, so a call is bounded before it is parsed,
rendered or tokenised: the body's size (413, from its ``Content-Length``), the number of
messages and the characters of their text (400), and valid Unicode in every string (a lone
surrogate from a ``\\u`` escape could be rendered into no reply), checked in one pass
linear in the body's size. Stop strings are at most :data:`MAX_STOP_STRINGS` of
:data:`MAX_STOP_CHARS` characters. An error message echoes at most a short prefix of a bad value
(:func:`shown`). The episode's token budget is checked against the characters first: no token
of the tokenizer covers more than :func:`max_token_chars` characters, so a call whose text
needs more tokens than the budget leaves is refused without tokenising it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CALL_CHARS",
    "MAX_ERROR_CHARS",
    "MAX_MESSAGES",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "check_unicode",
    "max_token_chars",
    "min_tokens",
    "shown",
]

MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body (413 above it): room for :data:`MAX_CALL_CHARS` with escapes."""
MAX_MESSAGES = 4096
"""Messages in one call."""
MAX_ERROR_CHARS = 500
"""Characters of an error message; a bad value is echoed by its first 40."""
MAX_STOP_STRINGS = 4
"""Stop strings of one call (``stop``)."""
MAX_STOP_CHARS = 256
"""Characters of one stop string: matching costs each row this many characters a step."""
MAX_CALL_CHARS = 2_000_000
"""Characters of message text (contents, tool-call arguments, tools) in one call, about half a
million tokens: far beyond any context the trainer generates in."""


def check_unicode(value: Any, where: str) -> str | None:
    """The path (``messages[3].content``) of the first string, key or value, in ``value`` that
    is not valid Unicode, or None. Iterative (no depth limit) and linear in the size of
    ``value``: each element is visited once, the memory held is one frame per level of
    nesting, and the path is spelled out only for the string that fails."""
    if isinstance(value, str):
        return None if _encodable(value) else where
    if not isinstance(value, (list, dict)):
        return None
    stack: list[tuple[Iterator[tuple[Any, Any]], _Link | None]] = [(_items(value), None)]
    while stack:
        items, link = stack[-1]
        for key, sub in items:
            if isinstance(key, str) and not _encodable(key):
                return f"{_path(where, link)} (a key)"
            if isinstance(sub, str):
                if not _encodable(sub):
                    return _path(where, (link, key))
            elif isinstance(sub, (list, dict)):
                stack.append((_items(sub), (link, key)))
                break
        else:
            stack.pop()
    return None


def _items(container: list[Any] | dict[Any, Any]) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


_Link = tuple[Any, Any]
"""(the parent's link or None, this element's key or index)."""


def _path(where: str, link: _Link | None) -> str:
    parts: list[str] = []
    while link is not None:
        link, key = link
        parts.append(f"[{key}]" if isinstance(key, int) else f".{shown(key, 40, quote=False)}")
    return where + "".join(reversed(parts))


def shown(value: Any, limit: int = 40, quote: bool = True) -> str:
    """``value`` as an error message may echo it: ``repr`` (or ``str`` when not ``quote``)
    cut to ``limit`` characters plus ``...``, lone surrogates escaped. Costs O(limit) for a
    string or a list or dict of any size or depth."""
    if isinstance(value, str):
        head = value[: limit + 1]
        text = repr(head) if quote else head
    elif isinstance(value, (list, dict)):
        text = _shallow_repr(value, limit)
    else:
        text = repr(value)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def _shallow_repr(value: list[Any] | dict[Any, Any], limit: int) -> str:
    """The first ``limit`` (or a few more) characters of ``repr(value)``, built depth first and
    stopped there: O(limit) work whatever the size or depth of ``value``."""
    out: list[str] = []
    size = 0
    stack: list[Any] = [value]
    while stack and size <= limit:
        item = stack.pop()
        if isinstance(item, _Text):
            piece = item.text
        elif isinstance(item, list):
            piece = "["
            stack.append(_Text("]"))
            for i in range(min(len(item), limit) - 1, -1, -1):
                stack.append(item[i])
                if i:
                    stack.append(_Text(", "))
        elif isinstance(item, dict):
            piece = "{"
            stack.append(_Text("}"))
            pairs = [pair for _, pair in zip(range(limit), item.items())]
            for i in range(len(pairs) - 1, -1, -1):
                stack.extend([pairs[i][1], _Text(": "), pairs[i][0]])
                if i:
                    stack.append(_Text(", "))
        else:
            piece = repr(item[: limit + 1] if isinstance(item, str) else item)
        out.append(piece)
        size += len(piece)
    return "".join(out)


class _Text:
    """A piece of :func:`_shallow_repr`'s output waiting on its stack."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def max_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for (its longest vocabulary entry,
    which for byte-level vocabularies counts bytes, at least the characters); at least 1."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    longest = max((len(token) for token in vocab), default=0)
    return max(1, longest)


def min_tokens(chars: int, per_token: int) -> int:
    """The fewest tokens ``chars`` characters can take when a token covers ``per_token``."""
    return -(-chars // per_token)
