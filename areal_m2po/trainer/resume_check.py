"""Whether a recover checkpoint may be resumed by this run's config (the start-up check of
:func:`areal_m2po.trainer.preflight.check_output_dir`).

Training keys that differ from the checkpoint's are refused unless
``recover.allow_changed_keys`` (:mod:`areal_m2po.utils.config_changes`); a resume that allows
them applies them, except the keys whose old value the checkpoint itself carries on
(:func:`fixed_on_resume`), which are refused even then: the model trained (its path, its
LoRA adapter), the optimizer's kind and the place in the training data.
"""

from __future__ import annotations

import logging
from typing import Any

from areal_m2po.utils import recover
from areal_m2po.utils.config_changes import Change, changed_training_keys, config_record, describe

__all__ = ["check_resumable", "fixed_on_resume"]

logger = logging.getLogger("areal_m2po.trainer")

_MODEL_PATHS = frozenset({"actor.path", "critic.path", "model.path", "critic.enabled"})


def fixed_on_resume(key: str) -> bool:
    """Whether the dotted ``key`` cannot take a new value on a resume: the trained model
    (``actor.path``, ``critic.path``, ``model.path``, ``critic.enabled``, any ``lora``
    setting) whose weights the checkpoint holds, ``*.optimizer.type`` whose state it holds,
    and ``train_dataset.*`` and ``seed``, the data and order whose position it holds."""
    parts = key.split(".")
    return (
        key in _MODEL_PATHS
        or "lora" in parts
        or key.endswith("optimizer.type")
        or parts[0] == "train_dataset"
        or key == "seed"
    )


def check_resumable(path: str, config: Any, world: int) -> None:
    """The checkpoint ``path`` against this run: its format, number of processes, the config
    items its ``meta.json`` says must not change, and the training keys of the whole config
    it recorded (``run_config``; older checkpoints have none), which may differ only with
    ``recover.allow_changed_keys``, and never those :func:`fixed_on_resume`.

    Raises:
        RecoverError: one line naming the checkpoint and each key that may not change.
    """
    meta = recover.read_meta(path, world, {})
    recorded = meta.get("run_config")
    changes = []
    if isinstance(recorded, dict):  # first: these keys are in meta.json's "config" too
        changes = changed_training_keys(recorded, config_record(config))
        _refuse_fixed(path, [c for c in changes if fixed_on_resume(c.key)])
    saved = meta.get("config", {})
    current = {}
    for key in saved:
        value: Any = config
        for part in key.split("."):
            value = getattr(value, part, None)
        current[key] = value
    recover.read_meta(path, world, current)
    recover.check_steps_left(path, meta, getattr(config, "total_train_steps", None))
    if not changes:
        return
    if config.recover.allow_changed_keys:
        logger.warning(
            "recover.allow_changed_keys: resuming %s with changed training keys: %s",
            path,
            describe(changes),
        )
        return
    raise recover.RecoverError(
        f"recover checkpoint {path} was written with other training keys: "
        f"{describe(changes)}; recover.allow_changed_keys=true resumes with the new values"
    )


def _refuse_fixed(path: str, fixed: list[Change]) -> None:
    if fixed:
        raise recover.RecoverError(
            f"recover checkpoint {path} was written with {describe(fixed)}, which cannot change "
            "on a resume, not even with recover.allow_changed_keys (the checkpoint carries "
            "the model it trained, its optimizer's state and its place in the training data): "
            "put them back"
        )
