"""The study's arms and the settings every round shares, loaded from ``arms.yaml`` (data, not
code); each round's own plan and rules are in ``rounds/`` (:mod:`.rounds`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

ARMS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "arms.yaml")
STALENESS_ROLES = ("on_policy", "stale")
METRICS = ("actor/clip_fraction", "m2po/masked_fraction")


@dataclass(frozen=True)
class Arm:
    """One arm of the study: its label, staleness role and the config keys that define it."""

    name: str
    label: str
    staleness: str  # one of STALENESS_ROLES
    metric: str  # the per-update "masked or clipped" fraction, one of METRICS
    overrides: tuple[str, ...]  # KEY=VALUE strings for python -m areal_m2po.train
    note: str = ""

    @property
    def uses_m2po(self) -> bool:
        return self.metric == "m2po/masked_fraction"

    def staleness_at(self, study_staleness: int) -> int:
        """rollout.staleness of this arm in a study run at ``study_staleness``."""
        return study_staleness if self.staleness == "stale" else 0


def _override_value(value: Any) -> str:
    """A YAML scalar as the trainer's command line reads it back (null, true, 1e-05, text)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse_arm(name: str, raw: Any, path: str) -> Arm:
    where = f"{path}: arms.{name}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(raw).__name__}")
    unknown = set(raw) - {"label", "staleness", "metric", "note", "overrides"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")
    if raw.get("staleness") not in STALENESS_ROLES:
        raise ValueError(f"{where}.staleness: {raw.get('staleness')!r} not in {STALENESS_ROLES}")
    if raw.get("metric") not in METRICS:
        raise ValueError(f"{where}.metric: {raw.get('metric')!r} not in {METRICS}")
    overrides = raw.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ValueError(f"{where}.overrides: expected a mapping of config keys")
    return Arm(
        name=name,
        label=str(raw.get("label") or name),
        staleness=raw["staleness"],
        metric=raw["metric"],
        overrides=tuple(f"{k}={_override_value(v)}" for k, v in overrides.items()),
        note=str(raw.get("note") or ""),
    )


def load_arms_file(path: str = ARMS_FILE) -> tuple[dict[str, Arm], dict[str, Any]]:
    """(arms by name, in file order; the default settings every round shares) from ``path``.

    Raises:
        ValueError: a malformed file, naming the file and the offending key.
    """
    import yaml

    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict) or not isinstance(data.get("arms"), dict) or not data["arms"]:
        raise ValueError(f"{path}: needs a non-empty 'arms' mapping")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError(f"{path}: 'defaults' must be a mapping")
    unknown = set(data) - {"defaults", "arms"}
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)} (a round's plan: rounds/)")
    arms = {name: _parse_arm(name, raw, path) for name, raw in data["arms"].items()}
    return arms, defaults
