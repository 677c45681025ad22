"""AReaL's recording OpenAI client (``areal.experimental.openai`` at areal-project/AReaL
cbff54d6): :class:`ArealOpenAI` and the interactions it records. AReaL's proxy server
(``OpenAIProxyClient``, ``OpenAIProxyWorkflow``) is this package's agent endpoint
(:mod:`areal_m2po.rollout.openai`), reached through ``rollout.workflow: agent``."""

from areal_m2po.areal.experimental.openai.cache import InteractionCache
from areal_m2po.areal.experimental.openai.client import ArealOpenAI
from areal_m2po.areal.experimental.openai.types import InteractionWithTokenLogpReward

__all__ = ["ArealOpenAI", "InteractionCache", "InteractionWithTokenLogpReward"]
