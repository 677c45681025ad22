"""Optional features and the pip extras that bring their packages.

``pip install areal_m2po`` installs the core: synchronous RL with the in-process Hugging Face
engine, SFT and reward-model training, metrics to ``metrics.jsonl``/console/wandb. A feature
outside it needs an extra (``pyproject.toml``'s ``[project.optional-dependencies]``); a config
that asks for one whose packages are missing stops before any model loads with one line naming
the key and the extra, e.g.::

    error: rollout.mode: async rollout with our rollout servers needs fastapi, uvicorn (not
    installed); pip install 'areal_m2po[server]'

Which features of a config need which extra is a start-up check
(:func:`areal_m2po.trainer.preflight.check_extras`); this module holds the table and the one
refusal. It only looks for the packages (``importlib.util.find_spec``); it imports none of them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from areal_m2po.api.errors import ConfigError

__all__ = ["EXTRAS", "missing_modules", "require_extra"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "uvicorn", "httpx"),
    "agent": ("openai", "fastapi", "uvicorn"),
    "lora": ("peft",),
    "plot": ("matplotlib",),
    "gguf": ("gguf",),
    "tensorboard": ("tensorboard",),
}
"""Each extra and the import names of the packages it installs (as ``pyproject.toml`` lists
them)."""


def missing_modules(modules: Iterable[str]) -> list[str]:
    """The names in ``modules`` that cannot be imported here (found without importing them)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require_extra(key: str, feature: str, extra: str, modules: Iterable[str] | None = None) -> None:
    """Raise :class:`ConfigError` naming ``key`` and ``pip install 'areal_m2po[extra]'`` when
    one of ``modules`` (default: every package of ``extra``) is not installed.

    Args:
        key: the config key (or command) that asks for the feature, e.g. ``actor.lora``.
        feature: the feature in a few words, e.g. ``LoRA adapters``.
        extra: the extra that installs it, a key of :data:`EXTRAS`.
        modules: the import names the feature needs (a subset of the extra's).
    """
    missing = missing_modules(EXTRAS[extra] if modules is None else modules)
    if missing:
        raise ConfigError(
            key,
            f"{feature} needs {', '.join(missing)} (not installed); "
            f"pip install 'areal_m2po[{extra}]'",
        )
