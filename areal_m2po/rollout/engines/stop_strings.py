"""Stop strings matched on the decoded tail of each row, with no per-vocabulary table.

``transformers``' ``StopStringCriteria`` precomputes, per request, tables of vocabulary x stop
strings x their length (15 s and +0.8 GiB for 16 strings of 256 characters at a 50k
vocabulary) and caches the last 8 such tables. :class:`TailStopStrings` instead decodes, after
each step, only the last tokens of each row that can hold a stop string ending in the newest
token, and looks for the strings in that text: its cost per step is rows x (longest stop
string + the newest token) characters, and it keeps nothing beyond the call.

A row stops when its generated text holds a stop string (the string may end inside the newest
token), the rule :meth:`~areal_m2po.rollout.engines.hf_generator.HFGenerator.finish_reasons`
reads back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["TailStopStrings", "unmatchable_stop"]

_BYTES_PER_CHAR = 4
"""A character is at most 4 UTF-8 bytes, and every token holds at least one byte, so a string
of ``L`` characters spans at most ``4 * L`` tokens."""


class TailStopStrings:
    """A ``transformers`` stopping criterion (and a decode-loop stop test) for ``stops``.

    Args:
        tokenizer: decodes token ids to text.
        stops: non-empty stop strings.
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self._start: int | None = None

    def row_done(self, ids: Sequence[int]) -> bool:
        """Whether the generated ``ids`` of one row end in a text holding a stop string that
        the newest token completes (only the tail that can hold it is decoded)."""
        if not ids or not self.stops:
            return False
        newest = len(self.tokenizer.decode(ids[-1:]))
        need = self.longest + newest
        cap = min(len(ids), _BYTES_PER_CHAR * self.longest + 1)
        window = min(cap, self.longest + 1)
        while True:
            text = self.tokenizer.decode(ids[-window:])
            if len(text) >= need or window >= cap:
                break
            window = min(cap, 2 * window)
        tail = text[-need:]
        return any(s in tail for s in self.stops)

    def done(self, generated: torch.Tensor) -> torch.Tensor:
        """Rows of ``generated`` ``[B, C]`` (generated ids only) that a stop string ends:
        bool ``[B]``."""
        rows = generated.tolist()
        return torch.tensor(
            [self.row_done(r) for r in rows], dtype=torch.bool, device=generated.device
        )

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        """``transformers``' criterion call: ``input_ids`` ``[B, P + C]``, the prompt columns
        ``P`` fixed by the first call (which sees one generated column)."""
        if self._start is None:
            self._start = input_ids.shape[1] - 1
        return self.done(input_ids[:, self._start :]).to(input_ids.device)


def unmatchable_stop(tokenizer: Any, stops: Sequence[str]) -> str | None:
    """The first of ``stops`` that no decoded text of ``tokenizer`` can hold (its tokens
    decode to something else, such as ``€`` in a vocabulary without it), or None. Costs the
    strings' length: no vocabulary table."""
    for stop in stops:
        ids = tokenizer.encode(stop, add_special_tokens=False)
        if stop not in tokenizer.decode(ids):
            return stop
    return None
