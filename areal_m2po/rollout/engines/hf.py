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

Faults stay with their request: a request whose token ids fall outside the vocabulary or
whose prompt plus ``max_new_tokens`` exceeds the model's positions is refused before it is
batched (:class:`~areal_m2po.api.engine_api.RequestError`, :mod:`.request_limits`), and when
a ``generate`` call fails its requests are run again one by one
(:func:`~.request_batcher.answer_each`), so only a request that fails alone fails.

:meth:`HFInProcessEngine.pause` cuts the running ``generate`` call short at its next step:
rows that had not ended come back ``abort`` with the tokens made so far, and their
``agenerate`` continues them from those tokens once :meth:`~HFInProcessEngine.resume` is
called (each token keeps the log-prob and version of the weights that made it), as the remote
engine continues the requests a server aborts. Rows a stop string ended are ``stop`` and are
not continued.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse, SamplingParams
from areal_m2po.rollout.common.weight_files import read_weights_of
from areal_m2po.rollout.engines.hf_generator import HFGenerator, StopWhenSet
from areal_m2po.rollout.engines.request_batcher import Job, RequestBatcher, answer_each
from areal_m2po.rollout.engines.request_limits import model_limits
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
        self.limits = model_limits(self.generator.model)
        self._model_lock = threading.Lock()
        self._interrupt = threading.Event()  # set while paused: generation stops at once
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
        """The completion of ``request``; one cut short by :meth:`pause` is continued from
        its tokens after :meth:`resume`."""
        self.limits.check(request.input_ids, request.sampling.max_new_tokens, "HF engine")
        t0 = time.perf_counter()
        s = request.sampling
        ids: list[int] = []
        logps: list[float] = []
        versions: list[int] = []
        while True:
            part = request
            if ids:  # the rest of an aborted completion, after its tokens
                rest = dataclasses.replace(
                    s,
                    max_new_tokens=s.max_new_tokens - len(ids),
                    min_new_tokens=max(0, s.min_new_tokens - len(ids)),
                )
                part = ModelRequest(list(request.input_ids) + ids, rest, rid=request.rid)
            out = await self._batcher.submit(part)
            ids += out.output_ids
            logps += out.output_logprobs
            versions += out.output_versions
            if out.finish_reason != "abort":
                return ModelResponse.to_request(
                    request, ids, logps, versions, out.finish_reason, t0
                )

    def _generate_jobs(self, jobs: list[Job]) -> list[ModelResponse | Exception]:
        """Responses to ``jobs`` in order: one ``generate`` call per distinct sampling, cut
        short when :meth:`pause` sets the interrupt (a job whose call fails, and fails again
        alone, gets its exception)."""
        by_params: dict[SamplingParams, list[int]] = {}
        for i, (req, _, _) in enumerate(jobs):
            by_params.setdefault(req.sampling, []).append(i)
        answers: list[ModelResponse | Exception | None] = [None] * len(jobs)
        with self._model_lock:
            for params, rows in by_params.items():
                if self._interrupt.is_set():  # paused before their turn: continued later
                    for i in rows:
                        req, _, t0 = jobs[i]
                        answers[i] = ModelResponse.to_request(req, [], [], [], "abort", t0)
                    continue
                run = functools.partial(self._sample, params)
                each: list[ModelResponse | Exception]
                each = answer_each(run, [jobs[i] for i in rows], "HF engine")
                for i, answer in zip(rows, each):
                    answers[i] = answer
        return [a for a in answers if a is not None]

    def _sample(self, params: SamplingParams, jobs: list[Job]) -> list[ModelResponse]:
        """One ``generate`` call answering ``jobs``, which share ``params`` (stopped at the
        next step once :meth:`pause` sets the interrupt)."""
        from transformers import StoppingCriteriaList

        contexts = [req.input_ids for req, _, _ in jobs]
        prompts, k = (contexts, 1) if params.greedy else plan_calls(contexts)
        batch = self.generator.generate(
            prompts,
            _gconfig(params, k),
            greedy=params.greedy,
            stop_token_ids=list(params.stop_token_ids),
            stopping_criteria=StoppingCriteriaList([StopWhenSet(self._interrupt)]),
        )
        version = self.generator.version
        finish = self.generator.finish_reasons(
            batch,
            params.max_new_tokens,
            params.stop_token_ids,
            params.stop,
            self._interrupt.is_set(),
        )
        return [
            self._response(req, batch, row, version, finish[row], t0)
            for row, (req, _, t0) in enumerate(jobs)
        ]

    def _response(
        self, req: ModelRequest, batch: Batch, row: int, version: int, finish: str, t0: float
    ) -> ModelResponse:
        mask = batch["loss_mask"][row]
        out = [int(t) for t in batch["input_ids"][row][mask].tolist()]
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
        """Cut the running ``generate`` call short at its next step and hold new ones; its
        unfinished requests are continued after :meth:`resume`. Returns once nothing is
        being generated."""
        self._interrupt.set()
        self._batcher.pause()

    def resume(self) -> None:
        self._interrupt.clear()
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
