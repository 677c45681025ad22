"""Token ids of a turn appended after the policy's turn, without re-tokenising what came before.

A multi-turn episode grows by appending: the tokens the engine generated stay exactly as they
are, and the next turn (an environment or tool message, then the header of the policy's next
turn) is tokenised on its own and added after them. The chat template's turn delimiters are
found once per tokenizer by rendering a conversation with sentinel contents and cutting the
text around them; the content itself is tokenised separately, so no model-written text is ever
tokenised again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from areal_m2po.rollout.token_text import encode_text

__all__ = ["TurnAppender"]

_SENTINEL_ASSISTANT = "\u2063ASSISTANT_SENTINEL\u2063"
_SENTINEL_MESSAGE = "\u2063MESSAGE_SENTINEL\u2063"
_PLAIN_BEFORE, _PLAIN_AFTER = "\n\n", "\n\n"


def _template_delimiters(tokenizer: Any, role: str) -> tuple[str, str]:
    """(text between an assistant turn's content and a ``role`` message's content, text after
    that content through the next generation prompt) from the tokenizer's chat template."""
    messages = [
        {"role": "user", "content": "question"},
        {"role": "assistant", "content": _SENTINEL_ASSISTANT},
        {"role": role, "content": _SENTINEL_MESSAGE},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    a_end = text.index(_SENTINEL_ASSISTANT) + len(_SENTINEL_ASSISTANT)
    m_start = text.index(_SENTINEL_MESSAGE)
    return text[a_end:m_start], text[m_start + len(_SENTINEL_MESSAGE) :]


@dataclass
class TurnAppender:
    """Builds the ids of "end of the policy's turn + a ``role`` message + next turn's header".

    Args:
        tokenizer: the policy's tokenizer.
        role: the role of appended messages (``user`` works with every template; ``tool`` only
            with templates that know it).
        use_chat_template: False, or a tokenizer without a template: turns are separated by a
            blank line.
    """

    tokenizer: Any
    role: str = "user"
    use_chat_template: bool = True

    def __post_init__(self) -> None:
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if self.use_chat_template and has_template:
            before, after = _template_delimiters(self.tokenizer, self.role)
        else:
            before, after = _PLAIN_BEFORE, _PLAIN_AFTER
        self.before_text, self.after_text = before, after
        self._before_ids = encode_text(self.tokenizer, before)
        self._after_ids = encode_text(self.tokenizer, after)
        eos = self.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
        # when the policy's turn ended with EOS and the template closes a turn with that same
        # token, the closing token is already in the sequence and is not appended again
        self._before_ids_after_eos = self._before_ids
        eos_text = self.tokenizer.eos_token or ""
        if eos_text and before.startswith(eos_text):
            self._before_ids_after_eos = encode_text(self.tokenizer, before[len(eos_text) :])

    def ids(self, content: str, policy_ended_with_eos: bool) -> list[int]:
        """Token ids to append after the policy's last generated token for message ``content``."""
        before = self._before_ids_after_eos if policy_ended_with_eos else self._before_ids
        return [*before, *encode_text(self.tokenizer, content), *self._after_ids]
