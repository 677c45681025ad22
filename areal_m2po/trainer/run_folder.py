"""Whether a run may write into its ``output_dir``: a run never destroys what another wrote.

A folder that holds a run (a non-empty ``metrics.jsonl``, a saved model under
``checkpoints/``, a recover checkpoint under ``recover/``) is

* resumed when ``recover.mode`` is ``auto`` or ``resume`` and it holds a recover checkpoint
  that matches this run (checked here, from its ``meta.json``, before any model loads);
* replaced when ``overwrite_output_dir`` is true (its metrics are started afresh, saved models
  of the same name and the old recover checkpoints are replaced as the run writes its own);
* refused otherwise, with one line naming both keys.

``recover.mode=resume`` without a recover checkpoint is refused here too.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from areal_m2po.api.errors import ConfigError
from areal_m2po.utils import recover

__all__ = ["check_output_dir", "previous_run"]

logger = logging.getLogger("areal_m2po.trainer")


def previous_run(output_dir: str) -> list[str]:
    """What ``output_dir`` holds of a run: ``metrics.jsonl`` (non-empty), ``checkpoints/``
    (non-empty) and ``recover/`` (with a complete checkpoint), in that order."""
    found = []
    metrics = os.path.join(output_dir, "metrics.jsonl")
    if os.path.isfile(metrics) and os.path.getsize(metrics) > 0:
        found.append("metrics.jsonl")
    saved = os.path.join(output_dir, "checkpoints")
    if os.path.isdir(saved) and os.listdir(saved):
        found.append("checkpoints/")
    if recover.list_checkpoints(recover.recover_root(output_dir)):
        found.append("recover/")
    return found


def check_output_dir(config: Any, world: int) -> None:
    """Raise :class:`ConfigError` when this run would overwrite another run's files in
    ``config.output_dir`` (see the module docstring), or when the recover checkpoint it would
    resume does not match it (``world`` processes, the config items the checkpoint lists).
    ``config`` is any trainer's root config; one without a ``recover`` section never resumes."""
    out = config.output_dir
    mode = config.recover.mode if hasattr(config, "recover") else "disabled"
    found = previous_run(out)
    if config.overwrite_output_dir:
        if mode == "resume":
            raise ConfigError(
                "overwrite_output_dir",
                "true starts afresh, recover.mode=resume must resume: set one of them",
            )
        if found:
            logger.warning("overwrite_output_dir: this run replaces the run in %s", out)
        return
    if mode != "disabled":
        try:
            path = recover.checkpoint_to_resume(recover.recover_root(out), mode)
        except recover.RecoverError as exc:
            raise ConfigError("recover.mode", str(exc)) from None
        if path is not None:
            try:
                _check_resumable(path, config, world)
            except recover.RecoverError as exc:
                raise ConfigError(
                    "recover.mode",
                    f"{exc}; overwrite_output_dir=true replaces that run, or choose another "
                    "output_dir",
                ) from None
            return
    if not found:
        return
    if mode != "disabled":
        how = f"it has no recover checkpoint to resume (recover.mode={mode}); "
    elif hasattr(config, "recover"):
        how = "resume it with recover.mode=auto, "
    else:
        how = ""
    raise ConfigError(
        "output_dir",
        f"{out} already holds a run ({', '.join(found)}); {how}set overwrite_output_dir=true "
        "to replace it, or choose another output_dir",
    )


def _check_resumable(path: str, config: Any, world: int) -> None:
    """The checkpoint ``path`` against this run: its format, number of processes and the
    config items its ``meta.json`` says must not change."""
    saved = recover.read_meta(path, world, {}).get("config", {})
    current = {}
    for key in saved:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part, None)
        current[key] = value
    recover.read_meta(path, world, current)
