"""A vLLM worker extension: reload the policy's weights from a directory, tied head included.

vLLM servers started by the trainer pass ``--worker-extension-cls
areal_m2po.rollout.vllm_worker_ext.WeightReloadExtension`` (this class, re-exported at that stable
path), which mixes these methods into
every vLLM worker; the trainer calls them through the dev-mode ``/collective_rpc`` endpoint
(``VLLM_SERVER_DEV_MODE=1``), as AReaL's vLLM server adds its ``/areal_update_weights``.

A server started with ``--weights-root`` (``AREAL_M2PO_WEIGHTS_ROOT`` in the worker's
environment) loads only from below that folder: the folder and every file read from it are
resolved (symlinks followed) first, so a real folder whose file links outside is refused too.
Every tensor is read and checked (the served model's names, finite values) before the model
is touched; shapes are checked by vLLM's own loaders as it copies.

This module is imported inside the vLLM worker process: it imports only the standard library,
torch, safetensors, :mod:`areal_m2po.rollout.engines.vllm.weights` and
:mod:`areal_m2po.rollout.common.guard`.
"""

from __future__ import annotations

import os
from typing import Any

from areal_m2po.rollout.common.guard import WEIGHTS_ROOT_ENV, below_root
from areal_m2po.rollout.engines.vllm.weights import checkpoint_names, with_tied_head

__all__ = ["WeightReloadExtension"]


def _weight_files(path: str, root: str | None) -> list[str]:
    """The resolved ``*.safetensors`` files of the folder ``path``; PermissionError for one
    that resolves outside ``root``."""
    names = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not names:
        raise FileNotFoundError(f"no *.safetensors under {path}")
    files = [os.path.realpath(os.path.join(path, name)) for name in names]
    for name, real in zip(names, files):
        if root and not below_root(real, root):
            raise PermissionError(f"{path}/{name} resolves outside the server's --weights-root")
    return files


class WeightReloadExtension:
    """Methods added to a vLLM worker (``self`` is the worker)."""

    def areal_reload_weights(self, path: str) -> dict[str, Any]:
        """Load every ``*.safetensors`` tensor under ``path`` into the model in place (with
        ``lm_head.weight`` = the embedding for a tied model, which vLLM's CPU backend needs);
        returns ``{"n_tensors": ...}``. Raises when the files lack a tensor of the served
        model's checkpoint (vLLM itself only logs that), and PermissionError when ``path``
        is not below the server's ``--weights-root``."""
        import torch
        from safetensors.torch import load_file

        root = os.environ.get(WEIGHTS_ROOT_ENV)
        if root and not below_root(path, root):
            raise PermissionError(f"{path} is not below the server's --weights-root {root}")
        state: dict[str, Any] = {}
        for file in _weight_files(path, root):
            state.update(load_file(file))
        for name, value in state.items():
            if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                raise ValueError(f"{path}: tensor {name!r} holds NaN or infinite values")
        model_config: Any = getattr(self, "model_config", None)
        hf_config = getattr(model_config, "hf_config", None)
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        expected = getattr(self, "_areal_names", None)
        if expected is None:
            expected = checkpoint_names(str(getattr(model_config, "model", "")))
            self._areal_names = expected
        missing = sorted(
            n for n in expected if n not in state and not (tied and n == "lm_head.weight")
        )
        if missing:
            raise ValueError(
                f"{path}: no value for {len(missing)} tensors of the served model "
                f"(e.g. {missing[0]!r})"
            )
        reload = self.reload_weights  # type: ignore[attr-defined]
        reload(weights_iterator=with_tied_head(iter(state.items()), tied))
        return {"n_tensors": len(state)}
