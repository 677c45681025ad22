"""The argument objects AReaL's library functions take, with the fields, defaults and checks
of ``areal/api/cli_args.py`` at areal-project/AReaL cbff54d6: ``Normalization(NormConfig(...))``,
``apply_rejection_sampling(..., RejectionSamplingConfig(...))``,
``split_padded_tensor_dict_into_mb_list(data, MicroBatchSpec(...))``.

They are plain dataclasses for library calls, not this trainer's config sections (those are
:mod:`areal_m2po.api.cli_args`, which also loads AReaL's YAML files): the trainer's sections
take the same keys with the trainer's defaults and one-line errors. ``PPOActorConfig`` is the
trainer's ``ActorConfig`` (AReaL's actor section).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any

from areal_m2po.algo.seqpack import PACKING_ALGORITHMS
from areal_m2po.api.cli_args import ActorConfig as PPOActorConfig

__all__ = ["MicroBatchSpec", "NormConfig", "PPOActorConfig", "RejectionSamplingConfig"]

_LEVELS = ("batch", "group", None)


@dataclass
class NormConfig:
    """Reward/advantage normalisation options (see :class:`~areal_m2po.areal.utils.data.Normalization`)."""

    mean_level: str | None = "batch"
    mean_leave1out: bool = False
    std_level: str | None = "batch"
    std_unbiased: bool = True
    eps: float = 1e-5
    group_size: int = 1

    def __post_init__(self) -> None:
        if self.mean_level not in _LEVELS:
            raise ValueError(f"mean_level must be 'batch', 'group' or None, got {self.mean_level}")
        if self.std_level not in _LEVELS:
            raise ValueError(f"std_level must be 'batch', 'group', or None, got {self.std_level}")
        if "group" in (self.mean_level, self.std_level) and self.group_size < 1:
            raise ValueError(
                "group_size must be a positive integer when using group normalization, "
                f"got {self.group_size}"
            )


@dataclass
class MicroBatchSpec:
    """How a batch is split into micro-batches (``max_tokens_per_mb`` None: no limit)."""

    n_mbs: int | None = 1
    granularity: int = 1
    max_tokens_per_mb: int | None = None
    n_mbs_divisor: int = 1
    packing_algorithm: str = "ffd"

    def __post_init__(self) -> None:
        if self.packing_algorithm not in PACKING_ALGORITHMS:
            raise ValueError(
                f"packing_algorithm must be one of {sorted(PACKING_ALGORITHMS)}, "
                f"got '{self.packing_algorithm}'"
            )

    @classmethod
    def new(cls, mb_spec: Any, **kwargs: Any) -> MicroBatchSpec:
        """A copy of ``mb_spec`` with ``kwargs`` replaced."""
        values = {f.name: getattr(mb_spec, f.name) for f in fields(cls)}
        return cls(**{**values, **kwargs})


@dataclass
class RejectionSamplingConfig:
    """Rejection-sampling options (see
    :func:`~areal_m2po.areal.utils.functional.apply_rejection_sampling`)."""

    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    agg: str = "mean"
    upper: float = 5.0
    lower: float | None = None

    def __post_init__(self) -> None:
        for name, valid in (
            ("level", ("token", "sequence")),
            ("action", ("mask", "clamp")),
            ("metric", ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")),
            ("agg", ("sum", "mean", "max")),
        ):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} must be one of {valid}, got '{getattr(self, name)}'")
        if self.lower is not None and self.lower > self.upper:
            raise ValueError(f"lower ({self.lower}) cannot be greater than upper ({self.upper})")
        self._check_bounds()
        if self.action == "clamp" and self.lower is None:
            self.lower = 0.0
        if self.level == "token" and self.agg != "mean":
            warnings.warn(
                f"agg='{self.agg}' is ignored when level='token'. "
                "Aggregation is only used for sequence-level filtering.",
                UserWarning,
                stacklevel=3,
            )

    def _check_bounds(self) -> None:
        if self.metric == "ratio":
            if self.upper <= 1.0:
                raise ValueError(
                    "upper must be > 1.0 for 'ratio' metric (otherwise all non-identical "
                    f"policy tokens will be filtered), got {self.upper}"
                )
            if self.lower is not None and self.lower <= 0:
                raise ValueError(f"lower must be positive for 'ratio' metric, got {self.lower}")
        if self.metric in ("kl_k2", "kl_k3") and self.upper <= 0:
            raise ValueError(f"upper must be positive for '{self.metric}' metric, got {self.upper}")
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError(
                "action='clamp' only supports metric='ratio' (direct importance weight "
                f"truncation). Got metric='{self.metric}'. Use action='mask' for KL-based "
                "filtering."
            )
