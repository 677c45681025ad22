"""The stable entry point users pass to vLLM servers, ``--worker-extension-cls
areal_m2po.rollout.vllm_worker_ext.WeightReloadExtension`` (code:
:mod:`areal_m2po.rollout.engines.vllm.worker_extension`)."""

from areal_m2po.rollout.engines.vllm.worker_extension import WeightReloadExtension

__all__ = ["WeightReloadExtension"]
