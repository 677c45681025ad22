"""The in-process vLLM engine: ``vllm.LLM`` inside the trainer's process (TRL's colocate mode).

:class:`VLLMInProcessEngine` implements :class:`~areal_m2po.api.engine_api.InferenceEngine`.
Requests that arrive together (the ``n`` requests of every group of a batch) are sampled in one
``LLM.generate`` call, batched as the HF engine batches them: after one full turn of the event
loop without a new request. vLLM's prefix cache shares the prefill of a group's ``n`` samples.

Behaviour log-probs: the engine runs with ``logprobs_mode="processed_logprobs"`` and asks for
the sampled token's log-prob (``SamplingParams(logprobs=0)``), which is
``log softmax(logits / temperature)[token]``, the trainer's convention (vLLM's default,
``raw_logprobs``, would give the temperature-1 log-probs). ``top_p``/``top_k`` are refused for
sampling: the processed log-probs would then be those of the truncated distribution.

Weights: :meth:`update_weights_from_tensors` streams the named tensors into vLLM's in-place
reload (``collective_rpc("reload_weights", weights_iterator=...)``; no disk), always with
``lm_head.weight`` for a tied model (:mod:`.vllm_weights`), resets the prefix cache (its KV
entries belong to the old weights) and stamps the version (vLLM labels every output token with
it). The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which
:meth:`initialize` sets together with the CPU variables of :func:`.vllm_setup.vllm_env`.

Faults stay with their request: a prompt that leaves no room in ``max_model_len`` or holds a
token id outside the vocabulary is refused before it is batched, sampling vLLM cannot honour
fails that request alone (both :class:`~areal_m2po.api.engine_api.RequestError`), and when
``LLM.generate`` fails (vLLM then aborts what it had added) its requests are run again one by
one (:func:`~..request_batcher.answer_each`).
"""

from __future__ import annotations

import functools
import gc
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse, RequestError
from areal_m2po.api.engine_api import SamplingParams as RequestSampling
from areal_m2po.rollout.common.weight_files import read_weights_of
from areal_m2po.rollout.engines.request_batcher import Job, RequestBatcher, answer_each
from areal_m2po.rollout.engines.request_limits import RequestLimits
from areal_m2po.rollout.engines.vllm.setup import (
    VLLMModelOptions,
    check_vllm_model,
    cuda_available,
    eos_ids_of,
    import_vllm,
    vllm_env,
)
from areal_m2po.rollout.engines.vllm.weights import (
    NameCheck,
    VersionOnlyState,
    checkpoint_names,
    with_tied_head,
)

__all__ = ["VLLMEngineOptions", "VLLMInProcessEngine", "to_vllm_sampling"]


@dataclass(frozen=True, kw_only=True)
class VLLMEngineOptions(VLLMModelOptions):
    """How the in-process ``vllm.LLM`` is built (the ``rollout.vllm.*`` config keys): the
    :class:`~.vllm_setup.VLLMModelOptions` and

    Args:
        enable_sleep_mode: CUDA only: the engine sleeps (frees its memory) around updates.
        max_num_seqs: sequences batched at most per engine step.
    """

    enable_sleep_mode: bool = False
    max_num_seqs: int = 256


def to_vllm_sampling(vllm: Any, s: RequestSampling, eos_ids: list[int]) -> Any:
    """vLLM ``SamplingParams`` for one completion of ``s`` with its sampled-token log-prob."""
    if not s.greedy and (s.top_p < 1.0 or s.top_k > 0):
        raise ValueError(
            f"vLLM engine: top_p={s.top_p}, top_k={s.top_k}: its behaviour log-probs would be "
            "those of the truncated distribution, not log softmax(logits / temperature)"
        )
    stops = list(dict.fromkeys([*eos_ids, *s.stop_token_ids]))
    return vllm.SamplingParams(
        n=1,
        temperature=0.0 if s.greedy else s.temperature,
        max_tokens=s.max_new_tokens,
        min_tokens=s.min_new_tokens,
        stop_token_ids=stops,
        stop=list(s.stop) or None,
        logprobs=None if s.greedy else 0,
        detokenize=bool(s.stop),
    )


def output_versions(spans: Any, n_tokens: int, default: int) -> list[int]:
    """Per-token versions from vLLM's weight-version spans (``default`` where unlabelled)."""
    versions = [default] * n_tokens
    for span in spans or ():
        label = str(span.version)
        if label.lstrip("-").isdigit():
            versions[span.start : span.end] = [int(label)] * (span.end - span.start)
    return versions


class VLLMInProcessEngine(VersionOnlyState, InferenceEngine):
    """vLLM in this process, on a copy of the policy loaded from ``model_path``.

    Args:
        model_path: a Hugging Face model directory (the policy's initial weights, its config).
        tokenizer: the policy's tokenizer (EOS and padding ids).
        tokenizer_path: where vLLM loads the tokenizer from (None: ``model_path``).
        options: how the engine is built.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer: Any,
        tokenizer_path: str | None = None,
        options: VLLMEngineOptions | None = None,
    ) -> None:
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.options = options or VLLMEngineOptions()
        self.eos_ids = eos_ids_of(tokenizer, model_path)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_ids[0]
        self.llm: Any = None
        self._vllm: Any = None
        self._version = 0
        self._tied = False
        self._names: set[str] = set()
        self._asleep = False
        self.limits = RequestLimits()  # known once the engine is built
        self._lock = threading.Lock()
        self._batcher = RequestBatcher(self._generate_jobs, self._lock)

    # -- lifecycle ----------------------------------------------------------------------------

    def initialize(self) -> None:
        """Build ``vllm.LLM`` (sets the vLLM environment variables of this process first)."""
        if self.llm is not None:
            return
        o = self.options
        on_gpu = cuda_available()
        check_vllm_model(self.model_path, on_gpu)
        os.environ.update(vllm_env(o.num_threads, o.kv_cache_gib, in_process=True))
        if not on_gpu and os.environ.get("TORCHDYNAMO_DISABLE", "1") == "1":
            # CPU: vLLM's sampler torch.compiles a helper (log-prob ranks), which compiles C++
            # again for new batch shapes: 15-75 s stalls in the first rounds here. Eager is
            # exact; the trainer compiles nothing. Set TORCHDYNAMO_DISABLE=0 to keep compiling.
            os.environ["TORCHDYNAMO_DISABLE"] = "1"
            import torch._dynamo

            torch._dynamo.config.disable = True
        self._vllm = import_vllm()
        from transformers import AutoConfig

        self._tied = bool(
            getattr(AutoConfig.from_pretrained(self.model_path), "tie_word_embeddings", False)
        )
        self._names = checkpoint_names(self.model_path)
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            tokenizer=self.tokenizer_path,
            dtype=o.dtype,
            max_model_len=o.max_model_len,
            seed=o.seed,
            enforce_eager=not on_gpu,  # CPU: compiled mode took ~100 s to start, no faster
            logprobs_mode="processed_logprobs",
            max_num_seqs=o.max_num_seqs,
        )
        if on_gpu:
            kwargs.update(gpu_memory_utilization=o.gpu_memory_utilization)
            kwargs.update(enable_sleep_mode=o.enable_sleep_mode)
        self.llm = self._vllm.LLM(**kwargs)
        self.llm.llm_engine.set_weight_version(str(self._version))
        model_config = self.llm.llm_engine.model_config
        self.limits = RequestLimits(
            vocab_size=int(model_config.get_vocab_size()),
            context_len=int(model_config.max_model_len),
            context_name="rollout.vllm.max_model_len",
            completion_capped=True,  # vLLM ends a completion at max_model_len (length)
        )

    def destroy(self) -> None:
        """Drop the engine (its memory is freed once nothing else holds it)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            with self._lock:
                del llm
            gc.collect()

    # -- generation ---------------------------------------------------------------------------

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        if self.llm is None:
            raise RuntimeError("vLLM engine: initialize() first")
        self.limits.check(request.input_ids, request.sampling.max_new_tokens, "vLLM engine")
        return await self._batcher.submit(request)

    def _generate_jobs(self, jobs: list[Job]) -> list[ModelResponse | Exception]:
        """One ``LLM.generate`` call over ``jobs``; for each in order its response, or the
        exception of that job alone."""
        answers: list[ModelResponse | Exception | None] = [None] * len(jobs)
        ready: list[tuple[int, Any]] = []  # (job index, its vLLM sampling)
        for i, (req, _, _) in enumerate(jobs):
            try:
                ready.append((i, to_vllm_sampling(self._vllm, req.sampling, self.eos_ids)))
            except ValueError as exc:
                answers[i] = RequestError(str(exc))
        with self._lock:
            if self.llm is None:
                raise RuntimeError("vLLM engine: destroyed")
            self._wake_locked()
            run = functools.partial(self._sample, jobs)
            each: list[ModelResponse | Exception] = answer_each(run, ready, "vLLM engine")
            for (i, _), answer in zip(ready, each):
                answers[i] = answer
            if self.options.enable_sleep_mode:  # free the GPU for the trainer until needed
                self.llm.sleep(level=1)
                self._asleep = True
        return [a for a in answers if a is not None]

    def _sample(self, jobs: list[Job], part: list[tuple[int, Any]]) -> list[ModelResponse]:
        """One ``LLM.generate`` call answering ``jobs[i]`` for each ``(i, sampling)`` of
        ``part``."""
        prompts = [
            self._vllm.TokensPrompt(prompt_token_ids=list(jobs[i][0].input_ids)) for i, _ in part
        ]
        outs = self.llm.generate(prompts, [params for _, params in part], use_tqdm=False)
        version = self._version
        return [
            self._response(jobs[i][0], out, version, jobs[i][2]) for (i, _), out in zip(part, outs)
        ]

    def _response(self, req: ModelRequest, out: Any, version: int, t0: float) -> ModelResponse:
        comp = out.outputs[0]
        ids = [int(t) for t in comp.token_ids]
        if req.sampling.greedy or comp.logprobs is None:
            logps = [0.0] * len(ids)
        else:
            logps = [float(step[tok].logprob) for step, tok in zip(comp.logprobs, ids)]
        finish = comp.finish_reason if comp.finish_reason in ("stop", "length") else "abort"
        versions = output_versions(getattr(comp, "weight_versions", None), len(ids), version)
        return ModelResponse.to_request(req, ids, logps, versions, finish, t0)

    # -- weights and versions -----------------------------------------------------------------

    def update_weights_from_tensors(
        self,
        named_tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        version: int,
    ) -> None:
        self.initialize()  # a resume loads the checkpoint's weights before the executor starts
        pairs = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        check = NameCheck(self._names, self._tied)
        stream = with_tied_head(check.wrap(pairs), self._tied)
        with self._lock:
            self._wake_locked()
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": stream})
            self.llm.reset_prefix_cache()
            missing = check.missing()
            if missing:
                raise RuntimeError(
                    f"vLLM weight update got no value for {len(missing)} tensors (e.g. "
                    f"{missing[0]!r}); the behaviour policy would silently keep old weights"
                )
            self._set_version_locked(version)

    def update_weights_from_disk(self, path: str, version: int) -> None:
        self.update_weights_from_tensors(read_weights_of(path, version), version)

    def _wake_locked(self) -> None:
        """Sleep mode (CUDA only; vLLM's CPU build has none, so this path is not exercised by
        the tests here): wake the engine before it generates or loads weights."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def _set_version_locked(self, version: int) -> None:
        self._version = int(version)
        if self.llm is not None:
            self.llm.llm_engine.set_weight_version(str(self._version))

    def pause(self) -> None:
        """Hold new batches back; returns once the running ``LLM.generate`` call has ended
        (it is not interrupted: ``LLM.generate`` runs to completion, so its rows finish
        ``stop`` or ``length`` and none needs continuing)."""
        self._batcher.pause()

    def resume(self) -> None:
        self._batcher.resume()

    def get_version(self) -> int:
        return self._version

    def set_version(self, version: int) -> None:
        with self._lock:
            self._set_version_locked(version)
