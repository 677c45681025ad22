"""Shared pieces of the multi-turn and OpenAI-endpoint tests: a tiny model behind the in-process
HF inference engine, with every weight version kept for exact log-prob checks."""

from __future__ import annotations

import copy
from typing import Any

import torch

from areal_m2po.api.engine_api import ModelRequest, ModelResponse
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.rollout.engines.hf import HFInProcessEngine
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


def tiny_model_and_tokenizer(seed: int = 0) -> tuple[torch.nn.Module, Any]:
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_llama(len(tokenizer), seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


class VersionedTinyEngine(HFInProcessEngine):
    """The in-process HF engine (concurrent requests batched into one ``generate`` call,
    left-padded), recording every (request, response) pair in ``calls``.

    With ``bump_every`` set, after that many responses it loads perturbed weights as the next
    version, so one episode's turns come from different versions; ``weights[v]`` keeps the
    state dict of every version for exact log-prob checks.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, bump_every: int | None = None):
        super().__init__(model, tokenizer, torch.device("cpu"))
        self.bump_every = bump_every
        self.weights = {0: copy.deepcopy(self.generator.model.state_dict())}
        self.calls: list[tuple[ModelRequest, ModelResponse]] = []

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        response = await super().agenerate(request)
        self.calls.append((request, response))
        if self.bump_every and len(self.calls) % self.bump_every == 0:
            self._bump()
        return response

    def _bump(self) -> None:
        generator = torch.Generator().manual_seed(len(self.weights))
        new = {
            k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in self.generator.model.state_dict().items()
        }
        version = self.generator.version + 1
        self.update_weights_from_tensors(new, version)
        self.weights[version] = copy.deepcopy(self.generator.model.state_dict())


def forward_logprobs(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], ids: list[int], temperature: float
) -> torch.Tensor:
    """``log softmax(logits / T)`` of every token given the ones before it, under ``weights``:
    [len(ids)] (entry 0 is 0)."""
    reference = copy.deepcopy(model)
    reference.load_state_dict(weights)
    with torch.no_grad():
        logits = reference(torch.tensor([ids])).logits[0].float() / temperature
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return torch.cat([torch.zeros(1), logp])
