"""What one chat-completions call to the agent endpoint may hold, checked before any work.

The endpoint lives in the trainer's process, so a call is bounded before it is parsed,
rendered or tokenised: the body's size (413, from its ``Content-Length``), the number of
messages and the characters of their text (400), and valid Unicode in every string (a lone
surrogate from a ``\\u`` escape could be rendered into no reply). The episode's token budget is
checked against the characters first: no token of the tokenizer covers more than
:func:`max_token_chars` characters, so a call whose text needs more tokens than the budget
leaves is refused without tokenising it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_CALL_CHARS",
    "MAX_MESSAGES",
    "check_unicode",
    "max_token_chars",
    "min_tokens",
]

MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body (413 above it): room for :data:`MAX_CALL_CHARS` with escapes."""
MAX_MESSAGES = 4096
"""Messages in one call."""
MAX_CALL_CHARS = 2_000_000
"""Characters of message text (contents, tool-call arguments, tools) in one call, about half a
million tokens: far beyond any context the trainer generates in."""


def check_unicode(value: Any, where: str) -> str | None:
    """The path (``messages[3].content``) of the first string, key or value, in ``value`` that
    is not valid Unicode, or None. Iterative: no depth limit."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not _encodable(item):
                return path
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str) and not _encodable(key):
                    return f"{path} (a key)"
                stack.append((sub, f"{path}.{key}"))
        elif isinstance(item, list):
            stack.extend((sub, f"{path}[{i}]") for i, sub in enumerate(item))
    return None


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
