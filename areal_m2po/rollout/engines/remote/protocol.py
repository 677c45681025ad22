"""What a server protocol supplies to the remote engine: its requests and how to read replies.

A backend (:mod:`.sglang`, :mod:`.vllm`) builds the HTTP calls of one protocol and parses its
generation replies; :class:`~.base.RemoteInferenceEngine` does everything else (the pool,
routing, continuing aborted requests, health, weight hand-over, errors) the same way for all.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.rollout.engines.remote.http_client import HttpCall

__all__ = ["GeneratedChunk", "RemoteBackend"]

DONE = ("stop", "length")
"""Finish reasons that end a completion; ``abort`` (cut short by a pause) is continued."""


@dataclass
class GeneratedChunk:
    """What one generation call produced (the three lists have one entry per token).

    Args:
        ids: generated token ids.
        logprobs: behaviour log-prob of each (nats; 0.0 when greedy).
        versions: weight version that produced each.
        finish: ``stop``, ``length`` or ``abort``.
    """

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish: str


class RemoteBackend(abc.ABC):
    """The protocol of one kind of rollout server."""

    kind: str = "rollout"
    """Names the protocol in messages."""

    @abc.abstractmethod
    def generate_call(self, context: list[int], sampling: SamplingParams, done: int) -> HttpCall:
        """The call that continues ``context`` (prompt + the ``done`` tokens generated so far)
        with the rest of ``sampling``'s budget. ValueError for sampling it cannot honour."""

    @abc.abstractmethod
    def parse_generate(
        self, body: Any, addr: str, sampling: SamplingParams, version: int
    ) -> GeneratedChunk:
        """The tokens of a generation reply from ``addr`` to a request sampled with
        ``sampling`` (greedy: log-probs 0.0); ``version`` is the engine's, for tokens the
        server did not label. :class:`~.errors.ServerError` when the reply is malformed."""

    @abc.abstractmethod
    def pause_call(self) -> HttpCall:
        """Stop generating: running requests end with finish ``abort``."""

    @abc.abstractmethod
    def resume_call(self) -> HttpCall:
        """Generate again after :meth:`pause_call`."""

    @abc.abstractmethod
    def load_weight_calls(self, path: str, version: int) -> list[HttpCall]:
        """The calls, made between pause and resume, that load the weights directory ``path``
        as ``version``."""

    def check_load_reply(self, call: HttpCall, reply: Any, addr: str) -> None:  # noqa: B027
        """Raise :class:`~.errors.ServerError` when ``reply`` to one of
        :meth:`load_weight_calls` says the load failed. Default: a 200 is success."""

    def label_calls(self, version: int) -> list[HttpCall]:
        """Calls that make a server stamp its tokens ``version`` (at start, after a resume).
        Default: none (the server stamps the version it loaded)."""
        return []

    def weights_to_write(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """The tensors written for the servers to load (consumes ``named_tensors``)."""
        return dict(named_tensors)
