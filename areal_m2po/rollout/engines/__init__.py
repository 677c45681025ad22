"""Inference engines (implementations of :class:`~areal_m2po.api.engine_api.InferenceEngine`):
:mod:`.hf` (Hugging Face ``generate`` in this process), :mod:`.remote` (rollout servers over
HTTP: one base, SGLang-protocol and vLLM backends) and :mod:`.vllm` (vLLM in this process)."""
