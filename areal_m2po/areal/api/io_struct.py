"""AReaL's generation request and response (``areal.api.io_struct`` at areal-project/AReaL
cbff54d6), as an AReaL workflow builds and reads them; the engine behind
:meth:`~areal_m2po.areal.api.engine_api.InferenceEngine.agenerate` is this package's
(:mod:`areal_m2po.api.engine_api`). Text only: AReaL's image fields are not here (a VLM is
out of scope).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from areal_m2po.areal.api.generation import GenerationHyperparameters

__all__ = ["ModelRequest", "ModelResponse"]


@dataclass
class ModelRequest:
    """One completion of ``input_ids`` sampled as ``gconfig`` says (its ``n_samples`` must be
    1: an engine call makes one completion, as AReaL's engines require)."""

    rid: str = field(default_factory=lambda: str(uuid.uuid4()))
    input_ids: list[int] = field(default_factory=list)
    gconfig: GenerationHyperparameters = field(
        default_factory=lambda: GenerationHyperparameters(n_samples=1)
    )
    metadata: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None

    def copy(self) -> ModelRequest:
        """A copy whose lists and metadata are its own."""
        return ModelRequest(
            rid=self.rid,
            input_ids=list(self.input_ids),
            gconfig=self.gconfig.new(),
            metadata=dict(self.metadata),
            tokenizer=self.tokenizer,
        )


@dataclass
class ModelResponse:
    """One completion: ``output_tokens`` with the behaviour log-prob (nats) and policy
    version of each, after the request's ``input_tokens``.

    ``stop_reason``: ``stop`` (EOS, a stop token or string: the last output token ended it),
    ``length`` (the token budget ran out) or ``abort`` (the engine was being shut down).
    """

    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    stop_reason: str = "stop"
    tokenizer: Any = None
    latency: float = float("inf")

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)
