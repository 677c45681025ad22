"""The argument objects of AReaL's library functions (``areal/api/cli_args.py`` at
areal-project/AReaL cbff54d6): ``Normalization(NormConfig(...))``,
``apply_rejection_sampling(..., RejectionSamplingConfig(...))``,
``split_padded_tensor_dict_into_mb_list(data, MicroBatchSpec(...))``, and ``PPOActorConfig``.

Each is this trainer's config class for the same concept (:mod:`areal_m2po.api.cli_args`),
subclassed only where AReaL's differs; the differences are written in each class:

* :class:`NormConfig` is the trainer's ``NormConfig`` with AReaL's defaults
  (:data:`~areal_m2po.api.areal.config.AREAL_NORM_DEFAULTS`, the ones an AReaL file's norm
  sections get too) and AReaL's checks first;
* :class:`RejectionSamplingConfig` is the trainer's with AReaL's checks first and AReaL's
  ``lower = 0.0`` for ``clamp``; its defaults are the trainer's (one ``upper``: 5.0);
* :class:`MicroBatchSpec` is the trainer's ``MicroBatchSplit`` with AReaL's extra keys;
* ``PPOActorConfig`` is the trainer's ``ActorConfig`` itself.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any

from areal_m2po.algo.seqpack import PACKING_ALGORITHMS
from areal_m2po.api.areal.config import AREAL_NORM_DEFAULTS
from areal_m2po.api.cli_args import ActorConfig as PPOActorConfig
from areal_m2po.api.cli_args import DPOConfig, MicroBatchSplit, RWConfig, SFTConfig
from areal_m2po.api.cli_args import NormConfig as TrainerNormConfig
from areal_m2po.api.cli_args import RejectionSamplingConfig as TrainerRejectionSamplingConfig
from areal_m2po.areal.api.expr_config import GRPOConfig, PPOConfig, load_expr_config
from areal_m2po.areal.api.generation import GenerationHyperparameters

__all__ = [
    "DPOConfig",
    "GRPOConfig",
    "GenerationHyperparameters",
    "MicroBatchSpec",
    "NormConfig",
    "PPOActorConfig",
    "PPOConfig",
    "RWConfig",
    "RejectionSamplingConfig",
    "SFTConfig",
    "load_expr_config",
]

_LEVELS = ("batch", "group", None)


@dataclass
class NormConfig(TrainerNormConfig):
    """AReaL's ``NormConfig`` (for :class:`~areal_m2po.areal.utils.data.Normalization`): the
    trainer's ``NormConfig`` with these differences:

    * defaults ``mean_level: batch``, ``std_level: batch``, ``group_size: 1`` (AReaL's; the
      trainer's section defaults to group statistics over ``gconfig.n_samples``);
    * AReaL's checks and messages come first (a plain ``ValueError``); then the trainer's,
      which also refuse a ``group_size`` below 1 and a negative ``eps`` (a ``ConfigError``,
      also a ``ValueError``); a leave-one-out mean without ``mean_level`` is allowed, as in
      AReaL (it has no effect), where the trainer's section refuses it;
    * the field order is the trainer's: pass the fields by keyword.
    """

    mean_level: str | None = AREAL_NORM_DEFAULTS["mean_level"]
    std_level: str | None = AREAL_NORM_DEFAULTS["std_level"]
    group_size: int | None = AREAL_NORM_DEFAULTS["group_size"]

    def __post_init__(self) -> None:
        if self.mean_level not in _LEVELS:
            raise ValueError(f"mean_level must be 'batch', 'group' or None, got {self.mean_level}")
        if self.std_level not in _LEVELS:
            raise ValueError(f"std_level must be 'batch', 'group', or None, got {self.std_level}")
        group = "group" in (self.mean_level, self.std_level)
        if group and (self.group_size is None or self.group_size < 1):
            raise ValueError(
                "group_size must be a positive integer when using group normalization, "
                f"got {self.group_size}"
            )
        super().__post_init__()

    def _check_leave1out(self) -> None:
        """AReaL lets ``mean_leave1out`` through without a mean (it then does nothing)."""


@dataclass
class MicroBatchSpec(MicroBatchSplit):
    """AReaL's ``MicroBatchSpec`` (for ``split_padded_tensor_dict_into_mb_list``): the
    trainer's ``MicroBatchSplit`` (``n_mbs``, ``max_tokens_per_mb``) with AReaL's keys
    ``granularity``, ``n_mbs_divisor`` and ``packing_algorithm``. Differences: no token
    budget by default (AReaL's ``max_tokens_per_mb: None``; the trainer's sections default to
    256 tokens, a memory setting the gradient does not depend on), and ``n_mbs`` must be an
    int >= 1 (AReaL also takes None)."""

    max_tokens_per_mb: int | None = None
    granularity: int = 1
    n_mbs_divisor: int = 1
    packing_algorithm: str = "ffd"

    def __post_init__(self) -> None:
        if self.packing_algorithm not in PACKING_ALGORITHMS:
            raise ValueError(
                f"packing_algorithm must be one of {sorted(PACKING_ALGORITHMS)}, "
                f"got '{self.packing_algorithm}'"
            )
        super().__post_init__()

    @classmethod
    def new(cls, mb_spec: Any, **kwargs: Any) -> MicroBatchSpec:
        """A copy of ``mb_spec`` with ``kwargs`` replaced."""
        values = {f.name: getattr(mb_spec, f.name) for f in fields(cls)}
        return cls(**{**values, **kwargs})


@dataclass
class RejectionSamplingConfig(TrainerRejectionSamplingConfig):
    """AReaL's ``RejectionSamplingConfig`` (for ``apply_rejection_sampling`` and the losses'
    ``rejection_sampling``): the trainer's section, same fields and defaults (``upper`` 5.0,
    AReaL's), with AReaL's behaviour on top:

    * AReaL's checks and messages come first (a plain ``ValueError``): ``upper > 1`` and
      ``lower > 0`` for the ratio, ``upper > 0`` for kl_k2/k3, clamp only on the ratio;
      ``binary_kl`` is accepted (AReaL's loss reads it; its config check at cbff54d6 lists
      it in the help only);
    * ``action: clamp`` without ``lower`` sets ``lower = 0.0``;
    * ``agg`` other than mean at token level warns (it is ignored);
    * then the trainer's rule, which also refuses ``lower == upper``.
    """

    def __post_init__(self) -> None:
        for name, valid in (
            ("level", ("token", "sequence")),
            ("action", ("mask", "clamp")),
            ("metric", ("ratio", "kl_k1", "kl_k2", "kl_k3", "binary_kl")),
            ("agg", ("sum", "mean", "max")),
        ):
            if getattr(self, name) not in valid:
                raise ValueError(f"{name} must be one of {valid}, got '{getattr(self, name)}'")
        self._check_areal_bounds()
        if self.action == "clamp" and self.lower is None:
            self.lower = 0.0
        if self.level == "token" and self.agg != "mean":
            warnings.warn(
                f"agg='{self.agg}' is ignored when level='token'. "
                "Aggregation is only used for sequence-level filtering.",
                UserWarning,
                stacklevel=3,
            )
        super().__post_init__()

    def _check_areal_bounds(self) -> None:
        upper = self.upper
        if upper is None:
            raise ValueError("upper must be a number (AReaL's RejectionSamplingConfig)")
        if self.lower is not None and self.lower > upper:
            raise ValueError(f"lower ({self.lower}) cannot be greater than upper ({upper})")
        if self.metric == "ratio":
            if upper <= 1.0:
                raise ValueError(
                    "upper must be > 1.0 for 'ratio' metric (otherwise all non-identical "
                    f"policy tokens will be filtered), got {upper}"
                )
            if self.lower is not None and self.lower <= 0:
                raise ValueError(f"lower must be positive for 'ratio' metric, got {self.lower}")
        if self.metric in ("kl_k2", "kl_k3") and upper <= 0:
            raise ValueError(f"upper must be positive for '{self.metric}' metric, got {upper}")
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError(
                "action='clamp' only supports metric='ratio' (direct importance weight "
                f"truncation). Got metric='{self.metric}'. Use action='mask' for KL-based "
                "filtering."
            )
