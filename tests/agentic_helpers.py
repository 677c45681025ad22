"""Shared pieces of the multi-turn and OpenAI-endpoint tests: a tiny model behind an engine of
the inference-engine interface, with every weight version kept for exact log-prob checks."""

from __future__ import annotations

import copy
from typing import Any

import torch

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.rollout import RolloutEngine
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


def tiny_model_and_tokenizer(seed: int = 0) -> tuple[torch.nn.Module, Any]:
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_llama(len(tokenizer), seed=seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval(), tokenizer


class VersionedTinyEngine(InferenceEngine):
    """The in-process :class:`RolloutEngine` behind the engine interface, one request at a time.

    With ``bump_every`` set, after that many requests it loads perturbed weights as the next
    version, so one episode's turns come from different versions. ``weights[v]`` keeps the
    state dict of every version and ``calls`` every (request, response) pair.
    """

    def __init__(self, model: torch.nn.Module, tokenizer: Any, bump_every: int | None = None):
        self.inner = RolloutEngine(model, tokenizer, torch.device("cpu"))
        self.tokenizer = tokenizer
        self.bump_every = bump_every
        self.weights = {0: copy.deepcopy(self.inner.model.state_dict())}
        self.calls: list[tuple[ModelRequest, ModelResponse]] = []
        self._seed = 0

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        s = request.sampling
        gconfig = GenerationConfig(
            n_samples=1,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature if s.temperature > 0 else 1.0,
            stop=list(s.stop) or None,
        )
        self._seed += 1
        batch = self.inner.generate([request.input_ids], gconfig, greedy=s.greedy, seed=self._seed)
        mask = batch["loss_mask"][0]
        ids = batch["input_ids"][0][mask].tolist()
        no_eos = bool(batch["no_eos"][0])
        hit_stop = bool(s.stop) and any(x in self.tokenizer.decode(ids) for x in s.stop)
        response = ModelResponse(
            input_ids=list(request.input_ids),
            output_ids=ids,
            output_logprobs=batch["logprobs"][0][mask].tolist(),
            output_versions=batch["versions"][0][mask].tolist(),
            finish_reason="stop" if (not no_eos or hit_stop) else "length",
            rid=request.rid,
        )
        self.calls.append((request, response))
        if self.bump_every and len(self.calls) % self.bump_every == 0:
            self._bump()
        return response

    def _bump(self) -> None:
        generator = torch.Generator().manual_seed(len(self.weights))
        new = {
            k: v + 0.05 * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
            for k, v in self.inner.model.state_dict().items()
        }
        version = self.inner.version + 1
        self.inner.update_weights(new, version)
        self.weights[version] = copy.deepcopy(self.inner.model.state_dict())

    def update_weights_from_tensors(self, named_tensors, version):  # type: ignore[no-untyped-def]
        self.inner.update_weights(named_tensors, version)

    def update_weights_from_disk(self, path, version):  # type: ignore[no-untyped-def]
        raise NotImplementedError("not used by these tests")

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def get_version(self) -> int:
        return self.inner.version

    def set_version(self, version: int) -> None:
        self.inner.version = version


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
