"""A base for the tests' scripted inference engines: they answer ``agenerate`` from a script and
hold a fixed weight version, with no weights to update."""

from __future__ import annotations

from areal_m2po.api.engine_api import InferenceEngine


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
