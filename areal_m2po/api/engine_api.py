"""The inference-engine interface: what a rollout backend (in-process HF, SGLang, vLLM, ...) does.

A rollout workflow (:mod:`areal_m2po.api.workflow_api`) asks an :class:`InferenceEngine` for
completions with :meth:`InferenceEngine.agenerate`, one :class:`ModelRequest` (one context,
one completion) at a time; the trainer hands it new weights with
:meth:`InferenceEngine.update_weights_from_tensors` or
:meth:`InferenceEngine.update_weights_from_disk`, each stamped with a policy version. Every
generated token comes back with the behaviour log-prob and the version of the weights that
produced it, which is all PPO/M2PO need to correct for off-policy samples.

Threads: ``agenerate`` runs on the rollout executor's asyncio event loop (the trainer's thread
in sync mode, a background thread in async mode). ``update_weights_*``, ``pause``,
``resume``, ``set_version``, ``initialize`` and ``destroy`` are called from the trainer's
thread, possibly while ``agenerate`` calls are in flight on the loop thread (async mode); an
engine must allow that. ``get_version`` may be called from either.

This module imports nothing of areal_m2po but :mod:`areal_m2po.api.cli_args`, so any backend
or workflow can import it.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from areal_m2po.api.cli_args import GenerationConfig

if TYPE_CHECKING:  # a type only (torch is no areal_m2po module: no cycle)
    import torch

__all__ = [
    "FINISH_REASONS",
    "InferenceEngine",
    "ModelRequest",
    "ModelResponse",
    "RequestError",
    "SamplingParams",
]

FINISH_REASONS = ("stop", "length", "abort")
"""Why a completion ended: ``stop`` (an EOS token, one of ``stop_token_ids``, or a stop
string: the last output token is the one that ended it, and it is kept), ``length``
(``max_new_tokens`` generated), ``abort`` (cut short and not continued; see
:class:`ModelResponse`)."""


class RequestError(Exception):
    """An engine refused one request: it cannot be served as asked (a context longer than the
    engine's limit, a token id outside the vocabulary, sampling the engine cannot honour).

    The engine is fine and every other request goes on; only the caller of this
    :meth:`InferenceEngine.agenerate` fails, with one line naming the limit. In-process
    engines raise it before the request is batched, remote engines before it is sent (or when
    a server answers 4xx: :class:`areal_m2po.rollout.engines.remote.errors.RequestError` is a
    subclass). The executor drops the record's group and counts it
    (``rollout/n_refused_groups``); the agent endpoint answers that call with a 400.
    """


@dataclass(frozen=True)
class SamplingParams:
    """How one completion is sampled.

    Args:
        max_new_tokens: tokens generated at most (>= 1).
        temperature: softmax temperature (> 0); 0 means greedy decoding, whose behaviour
            log-probs are reported as 0.0.
        top_p: nucleus mass in (0, 1]; 1 = off.
        top_k: keep the ``top_k`` most likely tokens; 0 = off.
        min_new_tokens: EOS and stop tokens are suppressed before this many tokens.
        stop_token_ids: tokens that end the completion like EOS (kept as its last token).
        stop: strings that end the completion once the decoded output contains one (the token
            completing it is kept; nothing after it is generated).
        max_tokens: the most tokens of context plus completion (AReaL's
            ``gconfig.max_tokens``), or None: a :class:`ModelRequest` lowers its
            ``max_new_tokens`` to fit (:meth:`for_context`).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise ValueError(f"max_new_tokens: must be an integer >= 1, got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature: must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0 (0 = off), got {self.top_k}")
        if self.max_tokens is not None and not (
            isinstance(self.max_tokens, int) and self.max_tokens >= 2
        ):
            raise ValueError(f"max_tokens: must be an integer >= 2 or None, got {self.max_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens: must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}"
            )

    @property
    def greedy(self) -> bool:
        """Greedy decoding (``temperature == 0``)."""
        return self.temperature == 0

    def for_context(self, n_context: int) -> SamplingParams:
        """These parameters for a context of ``n_context`` tokens: ``max_new_tokens`` lowered
        to ``max_tokens - n_context`` when that is smaller (``min_new_tokens`` with it).

        Raises:
            ValueError: the context leaves no room under ``max_tokens``.
        """
        if self.max_tokens is None or self.max_new_tokens + n_context <= self.max_tokens:
            return self
        room = self.max_tokens - n_context
        if room < 1:
            raise ValueError(
                f"max_tokens: a context of {n_context} tokens leaves no room to generate under "
                f"max_tokens={self.max_tokens}"
            )
        return dataclasses.replace(
            self, max_new_tokens=room, min_new_tokens=min(self.min_new_tokens, room)
        )

    @classmethod
    def from_gconfig(cls, g: GenerationConfig, greedy: bool = False) -> SamplingParams:
        """The sampling of the ``gconfig`` section (greedy: ``temperature`` 0, as evaluation
        and ``gconfig.greedy`` use)."""
        return cls(
            max_new_tokens=g.max_new_tokens,
            temperature=0.0 if greedy or g.greedy else g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            min_new_tokens=g.min_new_tokens,
            stop=tuple(g.stop or ()),
            max_tokens=g.max_tokens,
        )


@dataclass
class ModelRequest:
    """One generation request: continue ``input_ids`` with one sampled completion.

    Args:
        input_ids: the context's token ids (prompt, or a whole multi-turn history so far).
        sampling: how to sample; with ``sampling.max_tokens`` its ``max_new_tokens`` is lowered
            to what the context leaves (:meth:`SamplingParams.for_context`).
        rid: request id (logging, and servers that key requests by id).
        metadata: free for the workflow; engines pass it through untouched.
    """

    input_ids: list[int]
    sampling: SamplingParams
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.input_ids:
            raise ValueError("ModelRequest.input_ids: empty context")
        self.sampling = self.sampling.for_context(len(self.input_ids))


@dataclass
class ModelResponse:
    """The completion of one :class:`ModelRequest`.

    The three ``output_*`` lists have one entry per generated token, in order:

    Args:
        input_ids: the request's context (a copy of ``ModelRequest.input_ids``).
        output_ids: the generated token ids, the token that ended the completion included
            (EOS, a stop token, or the token completing a stop string); no padding.
        output_logprobs: behaviour log-prob (nats) of each output token under the weights that
            produced it: ``log softmax(logits / temperature)[token]`` over the full vocabulary,
            before ``top_p``/``top_k`` truncation; 0.0 for greedy decoding.
        output_versions: the policy version of the weights that produced each output token. A
            completion interrupted by a weight update and continued holds several versions
            (non-decreasing).
        finish_reason: one of :data:`FINISH_REASONS`. Engines continue a completion cut short
            by a weight update or a pause themselves, so ``abort`` reaches a workflow only
            when the engine is being destroyed.
        rid: the request's id.
        latency_s: wall-clock seconds from submission to the last token (information only).
    """

    input_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    output_versions: list[int]
    finish_reason: str
    rid: str = ""
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.output_logprobs) != n or len(self.output_versions) != n:
            raise ValueError(
                f"ModelResponse: {n} output_ids, {len(self.output_logprobs)} output_logprobs, "
                f"{len(self.output_versions)} output_versions (must be equal)"
            )
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"ModelResponse.finish_reason: {self.finish_reason!r} is not one of "
                f"{', '.join(FINISH_REASONS)}"
            )

    @classmethod
    def to_request(
        cls,
        request: ModelRequest,
        output_ids: Iterable[int],
        output_logprobs: Iterable[float],
        output_versions: Iterable[int],
        finish_reason: str,
        t0: float,
    ) -> ModelResponse:
        """The response to ``request`` (its context copied, its ``rid``) with these outputs
        (copied into lists); ``latency_s`` runs from ``t0``, a ``time.perf_counter()`` reading
        taken when the request was submitted."""
        return cls(
            input_ids=list(request.input_ids),
            output_ids=list(output_ids),
            output_logprobs=list(output_logprobs),
            output_versions=list(output_versions),
            finish_reason=finish_reason,
            rid=request.rid,
            latency_s=time.perf_counter() - t0,
        )

    @property
    def output_len(self) -> int:
        return len(self.output_ids)


class InferenceEngine(abc.ABC):
    """A rollout backend: generates with a versioned copy of the policy.

    Lifecycle: ``initialize()`` once before the first call (starting or reaching servers,
    loading a model), ``destroy()`` once at the end (idempotent; it must not raise when
    ``initialize`` failed half-way). Versions: a fresh engine holds version 0 unless
    ``initialize``/``set_version`` says otherwise; every ``update_weights_*`` call sets it.

    Attributes:
        exact_logprobs: True only when the behaviour log-probs are the trainer's own (the same
            model code on the same weights and dtype, equal up to batching order), as for the
            in-process Hugging Face engine. False (the default, and vLLM's and SGLang's case:
            their own kernels): the trainer recomputes the proximal log-probs even of
            on-policy batches and logs the difference as ``rollout/logp_mismatch_*``.
    """

    exact_logprobs: bool = False

    def initialize(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Get ready to serve (start or reach servers, load the model). Default: nothing."""

    def destroy(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release everything ``initialize`` acquired (idempotent). Default: nothing."""

    @abc.abstractmethod
    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        """Sample one completion of ``request.input_ids``.

        Concurrent calls are expected (a GRPO group issues its ``n`` requests at once, a
        batch issues all its groups'); an engine may batch them. Raises :class:`RequestError`
        when this request cannot be served (the others are unaffected), and another exception
        whose one-line message names the backend (a server address, say) when the engine
        cannot serve at all.
        """

    @abc.abstractmethod
    def update_weights_from_tensors(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int
    ) -> None:
        """Load new policy weights given in memory and stamp them ``version``.

        ``named_tensors`` yields ``(name, full tensor)`` pairs with the names of the policy's
        Hugging Face ``state_dict`` (a tied output embedding may come under one name only),
        once each; it is consumed exactly once and may gather from a sharded model as it
        goes, so an engine must not keep more of it than it needs. Returns when every token
        generated from then on uses the new weights and carries ``version`` (in-flight
        requests are finished with the old weights or interrupted and continued with the new
        ones; their per-token versions say which).
        """

    @abc.abstractmethod
    def update_weights_from_disk(self, path: str, version: int) -> None:
        """As :meth:`update_weights_from_tensors`, from a directory holding
        ``model.safetensors`` (and ``config.json``), as
        :func:`areal_m2po.rollout.common.weight_files.write_weights` writes it."""

    @abc.abstractmethod
    def pause(self) -> None:
        """Stop generating soon: running completions are interrupted (and continued after
        :meth:`resume`), new requests wait. Returns once nothing is being generated. An
        engine that cannot interrupt a running batch (vLLM in process) lets it finish and
        says so in its own docstring."""

    @abc.abstractmethod
    def resume(self) -> None:
        """Continue after :meth:`pause`."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """The policy version of the weights generating now."""

    def check_health(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Raise the error that keeps this engine from serving (a server died, and failures
        are not tolerated) with a one-line message naming the culprit; executors call it
        while they wait. Default: nothing (an engine that can only fail inside calls)."""

    def metrics(self) -> dict[str, float]:
        """Gauges logged with every training batch (e.g. ``rollout/n_servers``). Default:
        none."""
        return {}

    @abc.abstractmethod
    def set_version(self, version: int) -> None:
        """Declare the weights held now to be ``version`` (e.g. after a resume from a
        checkpoint, when the weights were loaded by other means)."""
