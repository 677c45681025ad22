"""Turning a model's dropout off (AReaL's ``disable_dropout``): training forwards then compute
the same log-probs as the recompute and reference forwards, which run in eval mode."""

from __future__ import annotations

import torch

__all__ = ["disable_dropout"]


def disable_dropout(model: torch.nn.Module) -> int:
    """Set every dropout probability of ``model`` to 0: each ``nn.Dropout``'s ``p`` and every
    float module attribute and config entry whose name contains ``dropout`` (the rates
    transformers' attention reads, e.g. ``attention_dropout``). Returns how many were
    non-zero."""
    changed = 0
    configs = [getattr(model, "config", None)]
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed += module.p != 0
            module.p = 0.0
        for name, value in vars(module).items():
            if "dropout" in name and isinstance(value, float):
                changed += value != 0
                setattr(module, name, 0.0)
        configs.append(getattr(module, "config", None))
    for config in {id(c): c for c in configs if c is not None}.values():
        for name, value in vars(config).items():
            if "dropout" in name and isinstance(value, float):
                changed += value != 0
                setattr(config, name, 0.0)
    return changed
