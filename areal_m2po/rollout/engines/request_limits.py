"""What one generation request must satisfy before an engine takes it: token ids inside the
vocabulary and a context that fits.

Every engine checks its requests with :class:`RequestLimits` before batching or sending them,
so a request that cannot fit fails alone, with one line naming the limit, instead of failing
the batch it would have joined (an out-of-vocabulary id is an index error on the CPU and a
device-side assert on CUDA; a prompt longer than vLLM's ``max_model_len`` fails vLLM's whole
``generate`` call).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from areal_m2po.api.engine_api import RequestError

__all__ = ["RequestLimits", "model_limits"]


@dataclass(frozen=True)
class RequestLimits:
    """The limits of one engine.

    Args:
        vocab_size: token ids must lie in ``[0, vocab_size)`` (None: not checked).
        context_len: positions the engine can hold (None: not checked).
        context_name: what sets ``context_len``, named in refusals (``max_position_embeddings``,
            ``rollout.vllm.max_model_len``, ``--context-length``).
        completion_capped: True when the engine itself ends a completion that reaches
            ``context_len`` (vLLM: finish ``length``), so only the prompt must leave room for
            one new token; False when the prompt plus ``max_new_tokens`` must fit, as SGLang
            and Hugging Face ``generate`` require.
    """

    vocab_size: int | None = None
    context_len: int | None = None
    context_name: str = "the context length"
    completion_capped: bool = False

    def refusal(self, input_ids: Sequence[int], max_new_tokens: int) -> str | None:
        """Why a request with this context and budget cannot be served (one line), or None."""
        vocab = self.vocab_size
        if vocab is not None and input_ids and not 0 <= min(input_ids) <= max(input_ids) < vocab:
            position, token = next((i, t) for i, t in enumerate(input_ids) if not 0 <= t < vocab)
            return (
                f"input_ids: token id {token} at position {position} is outside the vocabulary "
                f"[0, {vocab})"
            )
        if self.context_len is None:
            return None
        n = len(input_ids)
        if self.completion_capped and n >= self.context_len:
            return (
                f"input_ids: {n} tokens leave no room for a new token in the context of "
                f"{self.context_len} tokens ({self.context_name})"
            )
        if not self.completion_capped and n + max_new_tokens > self.context_len:
            return (
                f"input_ids: {n} tokens + max_new_tokens {max_new_tokens} exceed the context of "
                f"{self.context_len} tokens ({self.context_name})"
            )
        return None

    def check(self, input_ids: Sequence[int], max_new_tokens: int, engine: str) -> None:
        """Raise :class:`~areal_m2po.api.engine_api.RequestError` (``"<engine>: <why>"``) when
        the request cannot be served."""
        reason = self.refusal(input_ids, max_new_tokens)
        if reason is not None:
            raise RequestError(f"{engine}: {reason}")


def model_limits(model: Any) -> RequestLimits:
    """The limits of a Hugging Face causal LM: the rows of its input embedding and its
    configured positions (``max_position_embeddings``, or ``n_positions``); prompt plus
    ``max_new_tokens`` must fit, as ``generate`` needs."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    config = getattr(model, "config", None)
    vocab = int(rows) if rows is not None else getattr(config, "vocab_size", None)
    for name in ("max_position_embeddings", "n_positions"):
        positions = getattr(config, name, None)
        if isinstance(positions, int) and positions > 0:
            return RequestLimits(vocab, positions, name)
    return RequestLimits(vocab)
