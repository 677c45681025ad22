"""The behaviour log-prob of each sampled token, taken while ``generate`` runs.

``generate(..., output_logits=True)`` keeps every step's raw logits until it returns:
``B x C x V`` floats (64 x 16 x 49152 fp32 = 0.20 GB for the built-in demo's rollout batch),
only to gather one value per row and step afterwards. :class:`SampledLogprobRecorder` keeps one
step at a time instead. A forward hook on the model takes the last position's raw logits of each
forward pass (exactly the tensor ``generate`` reads, before any logits processor), and a logits
processor, which ``generate`` calls once after every forward pass with the tokens so far, turns
them into ``scaled = logits / temperature`` and its ``logsumexp``. At the next call the token
sampled from that step is the last column of ``input_ids``, so its log-prob
``scaled[token] - logsumexp(scaled)`` is gathered and the step's ``B x V`` tensor dropped;
:meth:`SampledLogprobRecorder.finish` gathers the last step from the returned sequences.
The arithmetic is the one the logits path did, in the same order, so the values are the same
bit for bit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["SampledLogprobRecorder"]


class SampledLogprobRecorder:
    """Per-step ``log softmax(logits / temperature)`` of the sampled tokens of one ``generate``.

    Use::

        rec = SampledLogprobRecorder(temperature)
        with rec.attached(model):
            seqs = model.generate(..., logits_processor=LogitsProcessorList([rec]))
        logp = rec.finish(seqs)  # [B, C] float32, C = the generated columns of seqs

    Args:
        temperature: the sampling temperature (> 0); the log-probs are of ``logits / T``.
    """

    def __init__(self, temperature: float) -> None:
        if not temperature > 0:
            raise ValueError(f"SampledLogprobRecorder: temperature must be > 0, got {temperature}")
        self.temperature = temperature
        self._raw: torch.Tensor | None = None  # [B, V] logits of the latest forward pass
        self._scaled: torch.Tensor | None = None  # [B, V] float32 logits / T of the last step
        self._lse: torch.Tensor | None = None  # [B, 1] logsumexp of _scaled
        self._columns: list[torch.Tensor] = []  # [B] per finished step

    @contextlib.contextmanager
    def attached(self, model: torch.nn.Module) -> Iterator[SampledLogprobRecorder]:
        """Record the last position's logits of every forward pass of ``model`` meanwhile."""
        handle = model.register_forward_hook(self._hook)
        try:
            yield self
        finally:
            handle.remove()
            self._raw = None

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if output.logits.shape[-2]:  # a prefill that kept no position has no logits
            self._raw = output.logits[:, -1]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """The logits-processor call (``scores`` pass through unchanged)."""
        if self._raw is None or self._raw.shape[0] != input_ids.shape[0]:
            raise RuntimeError(
                "SampledLogprobRecorder: no logits of this step's forward pass; call "
                "generate inside `with recorder.attached(model):`"
            )
        if self._scaled is not None:
            self._take(input_ids[:, -1])
        # generate reads outputs.logits[:, -1] as float32; the division and logsumexp are the
        # ones the output_logits path computed
        self._scaled = self._raw.float() / self.temperature
        self._lse = torch.logsumexp(self._scaled, -1, keepdim=True)
        self._raw = None
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        assert self._scaled is not None and self._lse is not None
        tok = tokens.to(self._scaled.device)[:, None]
        self._columns.append((self._scaled.gather(-1, tok) - self._lse)[:, 0])
        self._scaled = self._lse = None

    def finish(self, generated: torch.Tensor) -> torch.Tensor:
        """``[B, C]`` float32 log-probs of ``generated`` (``[B, C]``, the new columns of the
        returned sequences); columns past the recorded steps are 0."""
        if self._scaled is not None and len(self._columns) < generated.shape[1]:
            # the last step's token is in the sequences only (no processor call follows it)
            self._take(generated[:, len(self._columns)])
        self._scaled = self._lse = None
        b, c = generated.shape
        out = torch.zeros(b, c, dtype=torch.float32, device=generated.device)
        steps = min(c, len(self._columns))
        if steps:
            out[:, :steps] = torch.stack(self._columns[:steps], 1).to(out.device)
        self._columns = []
        return out
