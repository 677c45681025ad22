"""The configuration tree of an areal_m2po run: the public module its dataclasses are imported
from (``from areal_m2po.api.cli_args import ActorConfig, PPOConfig``).

One dataclass per section, each declared in a module of :mod:`areal_m2po.api.config` (engine,
actor, models, rollout, data, output, run, the root configs). Every field carries ``help`` (and,
where the value is one of a fixed set, ``choices``) in its metadata; that metadata drives
``--help``, the generated reference in ``docs/configuration.md`` and the validation. Each
``__post_init__`` checks its own fields' values and raises :class:`ConfigError` naming the
field; :class:`PPOConfig` checks the combinations that span sections. The same rules therefore
apply whether a config comes from YAML, the command line or Python
(``ActorConfig(m2_threshold=0.05, eps_clip=0.2, use_sapo_loss=False)``). Building a config reads
no file and looks up no package: what depends on the machine (paths, packages, the model's
positions) is checked at start-up (:mod:`areal_m2po.trainer.preflight`).

Key names follow AReaL's wherever AReaL has the concept.
"""

from __future__ import annotations

from areal_m2po.algo.options import (
    ADV_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    M2_TOKEN_SETS,
    NORM_LEVELS,
    REJECTION_ACTIONS,
    REJECTION_AGGS,
    REJECTION_METRICS,
)
from areal_m2po.api.config.actor import (
    ActorConfig,
    NormConfig,
    PPOActorConfig,
    RejectionSamplingConfig,
    check_rejection_sampling,
)
from areal_m2po.api.config.agent import AgentConfig
from areal_m2po.api.config.checks import ATTN_IMPLEMENTATIONS, DTYPES
from areal_m2po.api.config.data import (
    DatasetConfig,
    PreferenceDatasetConfig,
    RewardConfig,
    RewardModelConfig,
    SFTDatasetConfig,
)
from areal_m2po.api.config.engine import (
    BACKENDS,
    FrozenMicroBatchSpec,
    FSDPEngineConfig,
    LoRAConfig,
    MicroBatchSpec,
    MicroBatchSplit,
    OptimizerConfig,
    TrainedModelConfig,
    TrainEngineConfig,
)
from areal_m2po.api.config.models import CriticConfig, RefConfig, TeacherConfig
from areal_m2po.api.config.output import (
    EvaluatorConfig,
    RecoverConfig,
    SaverConfig,
    StatsLoggerConfig,
    TensorBoardConfig,
    WandBConfig,
)
from areal_m2po.api.config.ppo import PPOConfig
from areal_m2po.api.config.rollout import (
    SERVER_API_KEY_ENV,
    GenerationConfig,
    RolloutConfig,
    VLLMConfig,
)
from areal_m2po.api.config.run import HOST_MMAP_THRESHOLD_MIB, BaseExperimentConfig
from areal_m2po.api.config.trainers import (
    DPO_LOSS_TYPES,
    DPOConfig,
    RWConfig,
    RWModelConfig,
    SFTConfig,
)
from areal_m2po.api.errors import ConfigError

__all__ = [
    "ConfigError",
    "AgentConfig",
    "BaseExperimentConfig",
    "OptimizerConfig",
    "MicroBatchSpec",
    "MicroBatchSplit",
    "FrozenMicroBatchSpec",
    "FSDPEngineConfig",
    "LoRAConfig",
    "TrainedModelConfig",
    "TrainEngineConfig",
    "NormConfig",
    "RejectionSamplingConfig",
    "check_rejection_sampling",
    "ActorConfig",
    "PPOActorConfig",
    "CriticConfig",
    "RefConfig",
    "TeacherConfig",
    "GenerationConfig",
    "RolloutConfig",
    "DatasetConfig",
    "RewardModelConfig",
    "RewardConfig",
    "RWModelConfig",
    "PreferenceDatasetConfig",
    "RWConfig",
    "SFTDatasetConfig",
    "SFTConfig",
    "DPOConfig",
    "SaverConfig",
    "RecoverConfig",
    "EvaluatorConfig",
    "WandBConfig",
    "TensorBoardConfig",
    "StatsLoggerConfig",
    "PPOConfig",
]

# The choice lists and constants user code and tests read from this module (not in __all__,
# as before: ``from areal_m2po.api.cli_args import *`` brings the config classes only).
_CONSTANTS = (
    ADV_ESTIMATORS,
    ATTN_IMPLEMENTATIONS,
    BACKENDS,
    DPO_LOSS_TYPES,
    DTYPES,
    HOST_MMAP_THRESHOLD_MIB,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    M2_TOKEN_SETS,
    NORM_LEVELS,
    REJECTION_ACTIONS,
    REJECTION_AGGS,
    REJECTION_METRICS,
    SERVER_API_KEY_ENV,
    VLLMConfig,
)
