"""The in-process inference engine: Hugging Face ``generate`` on the policy (or a copy).

:class:`HFInProcessEngine` implements :class:`~areal_m2po.api.engine_api.InferenceEngine` over
:class:`~.hf_generator.HFGenerator`. Requests that arrive together (the ``n`` requests of every
group of a batch, issued at once by the executor's episodes) are sampled in **one**
``generate`` call: the engine waits until the event loop has gone one full turn without a new
request, then groups the pending requests by sampling parameters and, within a group, runs of
consecutive requests with the same context. With ``k`` the greatest common divisor of the run
lengths, each run becomes ``length / k`` prompts sampled ``k`` times with one shared prefill
(:mod:`.shared_prefill`), rows in request order. A batch of ``B`` groups of ``n``
therefore makes the very call the trainer made before workflows existed (``B`` prompts, ``n``
samples each), and with the same torch seed gives the same tokens.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_m2po.rollout.engines.hf_generator import HFGenerator
from areal_m2po.rollout.engines.request_batcher import Job, RequestBatcher
from areal_m2po.rollout.servers.weight_files import read_weights_of
from areal_m2po.utils.data import Batch

__all__ = ["HFInProcessEngine", "plan_calls"]


def plan_calls(contexts: list[list[int]]) -> tuple[list[list[int]], int]:
    """``(prompts, k)``: one ``generate`` call over ``prompts`` with ``k`` samples each whose
    rows ``0 .. len(contexts) - 1`` answer ``contexts`` in order (runs of equal consecutive
    contexts share a prompt; ``k`` is the gcd of the run lengths)."""
    runs: list[tuple[list[int], int]] = []
    for ctx in contexts:
        if runs and runs[-1][0] == ctx:
            runs[-1] = (ctx, runs[-1][1] + 1)
        else:
            runs.append((ctx, 1))
    k = 0
    for _, length in runs:
        k = math.gcd(k, length)
    prompts = [ctx for ctx, length in runs for _ in range(length // k)]
    return prompts, k


def _gconfig(s: SamplingParams, n: int) -> GenerationConfig:
    return GenerationConfig(
        n_samples=n,
        max_new_tokens=s.max_new_tokens,
        min_new_tokens=s.min_new_tokens,
        temperature=1.0 if s.greedy else s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        stop=list(s.stop) or None,
    )


class HFInProcessEngine(InferenceEngine):
    """Generation in this process, on a frozen copy of the policy or on the policy itself.

    Args:
        model: the policy (deep-copied, the copy being the behaviour policy, unless ``share``).
        tokenizer: its tokenizer.
        device: where generation runs.
        share: generate from ``model``, the trainer's own module, without a copy (sync mode:
            its weights are the behaviour policy's whenever the engine generates;
            :class:`~.hf_generator.HFGenerator`).

    Its behaviour log-probs come from the trainer's own model code on a copy of its weights
    (merged, with LoRA), so they are the trainer's up to batching order: ``exact_logprobs``.
    """

    exact_logprobs = True

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, device: torch.device, share: bool = False
    ) -> None:
        self.generator = HFGenerator(model, tokenizer, device, share=share)
        self._model_lock = threading.Lock()
        self._batcher = RequestBatcher(self._generate_jobs, self._model_lock)

    # -- properties the workflows and executors read -----------------------------------------

    @property
    def eos_ids(self) -> list[int]:
        return self.generator.eos_ids

    @property
    def pad_id(self) -> int:
        return self.generator.pad_id

    # -- InferenceEngine ----------------------------------------------------------------------

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        return await self._batcher.submit(request)

    def _generate_jobs(self, jobs: list[Job]) -> list[ModelResponse]:
        """Responses to ``jobs`` in order: one ``generate`` call per distinct sampling."""
        by_params: dict[SamplingParams, list[int]] = {}
        for i, (req, _, _) in enumerate(jobs):
            by_params.setdefault(req.sampling, []).append(i)
        answers: list[ModelResponse | None] = [None] * len(jobs)
        with self._model_lock:
            for params, rows in by_params.items():
                contexts = [jobs[i][0].input_ids for i in rows]
                if params.greedy:
                    prompts, k = contexts, 1
                else:
                    prompts, k = plan_calls(contexts)
                batch = self.generator.generate(
                    prompts,
                    _gconfig(params, k),
                    greedy=params.greedy,
                    stop_token_ids=list(params.stop_token_ids),
                )
                version = self.generator.version
                for row, i in enumerate(rows):
                    req, _, t0 = jobs[i]
                    answers[i] = self._response(req, batch, row, version, t0)
        return [a for a in answers if a is not None]

    def _response(
        self, req: ModelRequest, batch: Batch, row: int, version: int, t0: float
    ) -> ModelResponse:
        mask = batch["loss_mask"][row]
        out = [int(t) for t in batch["input_ids"][row][mask].tolist()]
        stops = set(self.generator.eos_ids) | set(req.sampling.stop_token_ids)
        if out and out[-1] in stops:
            finish = "stop"
        elif len(out) >= req.sampling.max_new_tokens:
            finish = "length"
        else:  # ended by a stop string
            finish = "stop"
        logps = [float(x) for x in batch["behave_logp"][row][mask].tolist()]
        return ModelResponse.to_request(req, out, logps, [version] * len(out), finish, t0)

    def update_weights_from_tensors(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        with self._model_lock:
            self.generator.update_weights(named_tensors, version)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self.update_weights_from_tensors(read_weights_of(path, version), version)

    def pause(self) -> None:
        self._batcher.pause()

    def resume(self) -> None:
        self._batcher.resume()

    def get_version(self) -> int:
        return self.generator.version

    def set_version(self, version: int) -> None:
        self.generator.version = int(version)

    # -- recover checkpoints ------------------------------------------------------------------

    def state_dict(
        self, policy: Iterable[tuple[str, torch.Tensor]], policy_version: int
    ) -> dict[str, Any]:
        """See :meth:`HFGenerator.state_dict`."""
        return self.generator.state_dict(policy, policy_version)

    def load_state_dict(self, state: Mapping[str, Any], policy: Any) -> None:
        """See :meth:`HFGenerator.load_state_dict`."""
        with self._model_lock:
            self.generator.load_state_dict(state, policy)
