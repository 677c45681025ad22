"""SGLang's HTTP protocol (the subset AReaL's remote SGLang engine uses), for our HF rollout
server (``python -m areal_m2po.rollout_server``) and SGLang's own.

Generation: ``POST /generate`` with ``input_ids``, ``sampling_params`` and ``return_logprob``;
the reply's ``meta_info`` carries the finish reason, ``output_token_logprobs``
(``[logprob, token_id, ...]`` per token) and the ``weight_version`` every token of the reply was
made with. Weights: ``/pause_generation`` (mode ``abort``), ``/update_weights_from_disk``
(``model_path``, ``weight_version``), ``/continue_generation``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.rollout.engines.remote.base import (
    RemoteEngineOptions,
    RemoteInferenceEngine,
    ServerPool,
)
from areal_m2po.rollout.engines.remote.errors import ServerError
from areal_m2po.rollout.engines.remote.http_client import HttpCall
from areal_m2po.rollout.engines.remote.protocol import DONE, GeneratedChunk, RemoteBackend

__all__ = ["RemoteSGLangEngine", "SGLangBackend", "parse_weight_version", "sglang_params"]


def sglang_params(s: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` of ``s`` (``max_new_tokens`` is set per request)."""
    params: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
    }
    if s.min_new_tokens:
        params["min_new_tokens"] = s.min_new_tokens
    if s.stop:
        params["stop"] = list(s.stop)
    if s.stop_token_ids:
        params["stop_token_ids"] = list(s.stop_token_ids)
    return params


def parse_weight_version(meta: dict[str, Any], addr: str) -> int:
    """The integer ``meta_info.weight_version`` of a reply from ``addr`` (ServerError if not)."""
    raw = meta.get("weight_version")
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ServerError(
            addr,
            f"meta_info.weight_version is {raw!r}, not an integer: load weights with "
            "/update_weights_from_disk and a weight_version first",
        ) from None


class SGLangBackend(RemoteBackend):
    """The SGLang protocol's calls and replies."""

    kind = "SGLang-protocol"

    def generate_call(self, context: list[int], sampling: SamplingParams, done: int) -> HttpCall:
        params = dict(sglang_params(sampling), max_new_tokens=sampling.max_new_tokens - done)
        # greedy: no log-probs (0.0); the tokens come as output_ids
        return HttpCall(
            "/generate",
            {
                "input_ids": context,
                "sampling_params": params,
                "return_logprob": not sampling.greedy,
                "stream": False,
            },
        )

    def parse_generate(
        self, body: Any, addr: str, sampling: SamplingParams, version: int
    ) -> GeneratedChunk:
        reply = body if isinstance(body, dict) else {}
        meta = reply.get("meta_info") or {}
        finish = (meta.get("finish_reason") or {}).get("type")
        if sampling.greedy:  # no log-probs asked (0.0): the tokens are output_ids
            ids = reply.get("output_ids")
            pairs = None if ids is None else [(0.0, t) for t in ids]
        else:
            pairs = meta.get("output_token_logprobs")
        if finish not in (*DONE, "abort") or pairs is None:
            raise ServerError(addr, f"/generate gave an unexpected reply: {str(body)[:300]}")
        server_version = parse_weight_version(meta, addr)
        return GeneratedChunk(
            ids=[int(p[1]) for p in pairs],
            logprobs=[float(p[0]) for p in pairs],
            versions=[server_version] * len(pairs),
            finish=finish,
        )

    def pause_call(self) -> HttpCall:
        return HttpCall("/pause_generation", {"mode": "abort"})

    def resume_call(self) -> HttpCall:
        return HttpCall("/continue_generation", {})

    def load_weight_calls(self, path: str, version: int) -> list[HttpCall]:
        body = {"model_path": path, "weight_version": str(version), "abort_all_requests": True}
        return [HttpCall("/update_weights_from_disk", body)]

    def check_load_reply(self, call: HttpCall, reply: Any, addr: str) -> None:
        if not (isinstance(reply, dict) and reply.get("success", False)):
            message = reply.get("message") if isinstance(reply, dict) else reply
            raise ServerError(addr, f"weight update failed: {message}")


class RemoteSGLangEngine(RemoteInferenceEngine):
    """Rollout on servers speaking SGLang's protocol (ours or SGLang's).

    Args:
        addrs: ``host:port`` of servers run elsewhere.
        options: timeouts, fault handling, ``weights_root``.
        processes: servers started for this run (stopped by :meth:`destroy`).
        model_config: the policy's ``transformers`` config, saved next to the weights.
        client_factory: see :class:`~.base.RemoteInferenceEngine`.
        rank, world: this trainer process and how many share the servers (rank 0 drives
            them; see :class:`~.base.RemoteInferenceEngine`).
    """

    def __init__(
        self,
        addrs: list[str] | None = None,
        options: RemoteEngineOptions | None = None,
        processes: ServerPool | None = None,
        model_config: Any = None,
        client_factory: Callable[[], Any] | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        super().__init__(
            SGLangBackend(),
            options,
            addrs,
            processes,
            model_config,
            client_factory=client_factory,
            rank=rank,
            world=world,
        )
