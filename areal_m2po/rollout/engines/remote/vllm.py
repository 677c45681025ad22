"""vLLM servers' HTTP protocol (``vllm serve`` with ``VLLM_SERVER_DEV_MODE=1``).

Generation: the token-in/token-out endpoint ``/inference/v1/generate`` (``token_ids`` in;
sampled ``token_ids``, each token's processed log-prob, i.e. ``log softmax(logits /
temperature)``, and the weight-version spans of the output out); vLLM labels each token with
the version set by ``/update_weight_version``, so the per-token versions are the server's own
record. Weights: ``/pause?mode=abort``, ``/collective_rpc`` of the worker extension's
``areal_reload_weights`` (:mod:`areal_m2po.rollout.engines.vllm.worker_extension`, the tied head
included), ``/reset_prefix_cache``, ``/update_weight_version``, ``/resume``. The servers are
the trainer's (:func:`areal_m2po.rollout.servers.launch.start_vllm_servers`) or addresses the
user gives (started with the same arguments,
:func:`areal_m2po.rollout.servers.launch.vllm_server_command`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.rollout.engines.remote.base import (
    RemoteEngineOptions,
    RemoteInferenceEngine,
    ServerPool,
)
from areal_m2po.rollout.engines.remote.errors import ServerError
from areal_m2po.rollout.engines.remote.http_client import HttpCall
from areal_m2po.rollout.engines.remote.protocol import DONE, GeneratedChunk, RemoteBackend
from areal_m2po.rollout.engines.vllm.setup import eos_ids_of
from areal_m2po.rollout.engines.vllm.weights import VersionOnlyState, with_tied_head

__all__ = ["RemoteVLLMEngine", "VLLMBackend", "sampling_payload", "span_versions"]

_GENERATE = "/inference/v1/generate"


def sampling_payload(s: SamplingParams, eos_ids: list[int], done: int) -> dict[str, Any]:
    """vLLM ``sampling_params`` (JSON) for the rest of ``s`` after ``done`` tokens."""
    if not s.greedy and (s.top_p < 1.0 or s.top_k > 0):
        raise ValueError(
            f"vLLM engine: top_p={s.top_p}, top_k={s.top_k}: its behaviour log-probs would be "
            "those of the truncated distribution, not log softmax(logits / temperature)"
        )
    params: dict[str, Any] = {
        "n": 1,
        "temperature": 0.0 if s.greedy else s.temperature,
        "max_tokens": s.max_new_tokens - done,
        "min_tokens": max(0, s.min_new_tokens - done),
        "stop_token_ids": list(dict.fromkeys([*eos_ids, *s.stop_token_ids])),
        "detokenize": bool(s.stop),
    }
    if not s.greedy:
        params["logprobs"] = 0
    if s.stop:
        params["stop"] = list(s.stop)
    return params


def span_versions(spans: Any, n_tokens: int, default: int) -> list[int]:
    """Per-token versions from JSON weight-version spans (``default`` where unlabelled)."""
    versions = [default] * n_tokens
    for span in spans or ():
        label = str(span.get("version"))
        if label.lstrip("-").isdigit():
            start, end = int(span["start"]), int(span["end"])
            versions[start:end] = [int(label)] * (end - start)
    return versions


class VLLMBackend(RemoteBackend):
    """vLLM servers' calls and replies.

    Args:
        eos_ids: token ids that end a completion (sent as ``stop_token_ids``).
        model_path: the policy's model directory (whether its embeddings are tied).
    """

    kind = "vLLM"

    def __init__(self, eos_ids: list[int], model_path: str) -> None:
        self.eos_ids = list(eos_ids)
        self.model_path = model_path
        self._tied: bool | None = None

    def generate_call(self, context: list[int], sampling: SamplingParams, done: int) -> HttpCall:
        payload = {
            "token_ids": context,
            "sampling_params": sampling_payload(sampling, self.eos_ids, done),
            "stream": False,
        }
        return HttpCall(_GENERATE, payload)

    def parse_generate(
        self, body: Any, addr: str, sampling: SamplingParams, version: int
    ) -> GeneratedChunk:
        try:
            choice = body["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            content = (choice.get("logprobs") or {}).get("content") or []
            if sampling.greedy:
                logprobs = [0.0] * len(ids)
            else:
                logprobs = [float(c["logprob"]) for c in content]
            finish = str(choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(addr, f"unexpected {_GENERATE} reply: {str(body)[:300]}") from None
        if len(logprobs) != len(ids):
            raise ServerError(addr, f"{len(ids)} tokens but {len(logprobs)} log-probs")
        if finish not in (*DONE, "abort"):
            raise ServerError(addr, f"unexpected finish_reason {finish!r}")
        versions = span_versions(choice.get("weight_versions"), len(ids), version)
        return GeneratedChunk(ids, logprobs, versions, finish)

    def pause_call(self) -> HttpCall:
        return HttpCall("/pause?mode=abort")

    def resume_call(self) -> HttpCall:
        return HttpCall("/resume")

    def load_weight_calls(self, path: str, version: int) -> list[HttpCall]:
        rpc = {"method": "areal_reload_weights", "kwargs": {"path": path}}
        return [
            HttpCall("/collective_rpc", rpc),
            HttpCall("/reset_prefix_cache"),
            *self.label_calls(version),
        ]

    def label_calls(self, version: int) -> list[HttpCall]:
        return [HttpCall("/update_weight_version", {"new_version": str(version)})]

    def weights_to_write(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """The tensors with ``lm_head.weight`` for a tied model (vLLM's CPU backend keeps
        the old output layer otherwise)."""
        return dict(with_tied_head(named_tensors, self._is_tied()))

    def _is_tied(self) -> bool:
        if self._tied is None:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(self.model_path)
            self._tied = bool(getattr(cfg, "tie_word_embeddings", False))
        return self._tied


class RemoteVLLMEngine(VersionOnlyState, RemoteInferenceEngine):
    """Rollout on vLLM servers: started here (``processes``) or reached at ``addrs``.

    Args:
        tokenizer: the policy's tokenizer (EOS ids).
        model_path: the policy's model directory (EOS ids of its generation config; whether
            its embeddings are tied).
        options: timeouts, fault handling, ``weights_root``.
        addrs: ``host:port`` of servers run elsewhere.
        processes: servers started for this run (rank 0; stopped by :meth:`destroy`).
        rank, world: this trainer process and how many share the servers (rank 0 drives
            them).
    """

    def __init__(
        self,
        tokenizer: Any,
        model_path: str,
        options: RemoteEngineOptions,
        addrs: list[str] | None = None,
        processes: ServerPool | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        backend = VLLMBackend(eos_ids_of(tokenizer, model_path), model_path)
        super().__init__(backend, options, addrs, processes, None, rank, world)
