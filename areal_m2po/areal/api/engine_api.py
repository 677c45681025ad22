"""The engine an AReaL workflow's ``arun_episode(engine, data)`` gets (``areal.api.engine_api``
at areal-project/AReaL cbff54d6): ``await engine.agenerate(ModelRequest)`` returning AReaL's
``ModelResponse``, over this package's rollout engine (:class:`areal_m2po.api.engine_api.
InferenceEngine`, which does the generation, versions and weight updates).
"""

from __future__ import annotations

from typing import Any

from areal_m2po.api.engine_api import InferenceEngine as _PackageEngine
from areal_m2po.api.engine_api import ModelRequest as _PackageRequest
from areal_m2po.areal.api.generation import GenerationHyperparameters
from areal_m2po.areal.api.io_struct import ModelRequest, ModelResponse

__all__ = ["InferenceEngine"]


class InferenceEngine:
    """AReaL's view of ``engine`` (a :class:`areal_m2po.api.engine_api.InferenceEngine`)."""

    def __init__(self, engine: _PackageEngine) -> None:
        self.engine = engine

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """One completion of ``req.input_ids`` sampled as ``req.gconfig`` says.

        Raises:
            ValueError: ``req.gconfig.n_samples`` is not 1, or ``req.input_ids`` is empty.
        """
        gconfig = GenerationHyperparameters.of(req.gconfig)
        if gconfig.n_samples != 1:
            raise ValueError(
                f"ModelRequest.gconfig.n_samples={gconfig.n_samples}: an engine call makes one "
                "completion (gconfig.new(n_samples=1)); the trainer runs gconfig.n_samples "
                "episodes per record"
            )
        resp = await self.engine.agenerate(
            _PackageRequest(
                list(req.input_ids), gconfig.to_sampling(), rid=req.rid, metadata=req.metadata
            )
        )
        return ModelResponse(
            input_tokens=list(resp.input_ids),
            output_tokens=list(resp.output_ids),
            output_logprobs=list(resp.output_logprobs),
            output_versions=list(resp.output_versions),
            stop_reason=resp.finish_reason,
            tokenizer=req.tokenizer,
            latency=resp.latency_s,
        )

    def get_version(self) -> int:
        """The policy version the engine generates with now."""
        return self.engine.get_version()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"InferenceEngine.{name}: an AReaL workflow here has agenerate() and get_version() "
            "only (the trainer owns weights, pausing and batching)"
        )
