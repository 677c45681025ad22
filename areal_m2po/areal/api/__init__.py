"""AReaL's ``areal.api`` names that library calls take (see :mod:`areal_m2po.areal`)."""

from areal_m2po.areal.api.engine_api import InferenceEngine
from areal_m2po.areal.api.io_struct import ModelRequest, ModelResponse
from areal_m2po.areal.api.reward_api import AsyncRewardWrapper
from areal_m2po.areal.api.workflow_api import AgentWorkflow, RolloutWorkflow, WorkflowLike

__all__ = [
    "AgentWorkflow",
    "AsyncRewardWrapper",
    "InferenceEngine",
    "ModelRequest",
    "ModelResponse",
    "RolloutWorkflow",
    "WorkflowLike",
]
