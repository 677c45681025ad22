"""A vLLM worker extension: reload the policy's weights from a directory, tied head included.

vLLM servers started by the trainer pass ``--worker-extension-cls
areal_m2po.rollout.vllm_worker_ext.WeightReloadExtension`` (this class, re-exported at that stable
path), which mixes these methods into
every vLLM worker; the trainer calls them through the dev-mode ``/collective_rpc`` endpoint
(``VLLM_SERVER_DEV_MODE=1``), as AReaL's vLLM server adds its ``/areal_update_weights``.

A server started with ``--weights-root`` (``AREAL_M2PO_WEIGHTS_ROOT`` in the worker's
environment) loads only from below that folder: each file is opened once and the file opened
must lie there (:mod:`areal_m2po.rollout.common.weight_reader`), so a real folder whose file
links outside is refused too, and a link swapped in after the check is never read. Each file
is read whole from that descriptor (no mapping: a file cut short while it loads is refused,
not a SIGBUS). Every tensor is checked (the served model's names and shapes, read from its
checkpoint's headers, and finite values) before the model is touched.

This module is imported inside the vLLM worker process: it imports only the standard library,
torch, safetensors, :mod:`areal_m2po.rollout.engines.vllm.weights`,
:mod:`areal_m2po.rollout.common.weight_reader` and :mod:`areal_m2po.rollout.common.guard`.
"""

from __future__ import annotations

import os
from typing import Any

from areal_m2po.rollout.common.guard import WEIGHTS_ROOT_ENV, below_root
from areal_m2po.rollout.common.weight_reader import read_safetensors
from areal_m2po.rollout.engines.vllm.weights import (
    check_reload,
    checkpoint_shapes,
    with_tied_head,
)

__all__ = ["WeightReloadExtension"]


def _read_folder(path: str, root: str | None) -> dict[str, Any]:
    """Every tensor of the ``*.safetensors`` files of the folder ``path``, each file read whole
    from one descriptor whose file must lie below ``root`` (PermissionError otherwise)."""
    names = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not names:
        raise FileNotFoundError(f"no *.safetensors under {path}")
    state: dict[str, Any] = {}
    for name in names:
        state.update(read_safetensors(os.path.join(path, name), root or None).tensors)
    return state


class WeightReloadExtension:
    """Methods added to a vLLM worker (``self`` is the worker)."""

    def areal_reload_weights(self, path: str) -> dict[str, Any]:
        """Load every ``*.safetensors`` tensor under ``path`` into the model in place (with
        ``lm_head.weight`` = the embedding for a tied model, which vLLM's CPU backend needs);
        returns ``{"n_tensors": ...}``. Raises, before the model is touched, when the files
        lack a tensor of the served model's checkpoint (vLLM itself only logs that) or hold one
        of another shape or with non-finite values, when a file changes while it is read, and
        PermissionError when ``path`` or a file is not below the server's ``--weights-root``."""
        root = os.environ.get(WEIGHTS_ROOT_ENV)
        if root and not below_root(path, root):
            raise PermissionError(f"{path} is not below the server's --weights-root {root}")
        state = _read_folder(path, root)
        model_config: Any = getattr(self, "model_config", None)
        hf_config = getattr(model_config, "hf_config", None)
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        expected = getattr(self, "_areal_shapes", None)
        if expected is None:
            expected = checkpoint_shapes(str(getattr(model_config, "model", "")))
            self._areal_shapes = expected
        check_reload(state, expected, tied, path)
        reload = self.reload_weights  # type: ignore[attr-defined]
        reload(weights_iterator=with_tied_head(iter(state.items()), tied))
        return {"n_tensors": len(state)}
