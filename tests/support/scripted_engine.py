"""The tests' scripted inference engines: :class:`ScriptOnlyEngine`, a base that answers
``agenerate`` from a script and holds a fixed weight version, with no weights to update; and
:class:`ScriptedEngine`, a model-free backend that takes weight updates."""

from __future__ import annotations

from areal_m2po.api.engine_api import InferenceEngine, ModelRequest, ModelResponse


class ScriptOnlyEngine(InferenceEngine):
    """Everything of :class:`InferenceEngine` but ``agenerate``: ``get_version`` is the class's
    ``version`` (``set_version`` leaves it), pause/resume do nothing, weight updates raise."""

    version = 0

    def update_weights_from_tensors(self, named_tensors, version):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def update_weights_from_disk(self, path, version):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def get_version(self) -> int:
        return self.version

    def set_version(self, version: int) -> None: ...


class ScriptedEngine(InferenceEngine):
    """A fake backend (no model): request ``k`` gets ``k % 4`` digit tokens then EOS, each with
    log-prob -2.0, stamped with the version it holds. It stands in for a server the trainer
    cannot tell apart from a real engine."""

    def __init__(self, digits: list[int], eos: int) -> None:
        self.digits, self.eos = digits, eos
        self.version, self.requests, self.loaded = 0, 0, []

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        k = self.requests % 4
        self.requests += 1
        out = self.digits[:k] + [self.eos]
        return ModelResponse(
            request.input_ids, out, [-2.0] * len(out), [self.version] * len(out), "stop"
        )

    def update_weights_from_tensors(self, named_tensors, version):
        self.loaded = [name for name, _ in named_tensors]
        self.version = version

    def update_weights_from_disk(self, path, version):
        raise AssertionError("the trainer hands weights over in memory")

    def pause(self):
        pass

    def resume(self):
        pass

    def get_version(self):
        return self.version

    def set_version(self, version):
        self.version = version
