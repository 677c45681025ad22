"""Servers this package runs: the HF rollout server (SGLang's protocol), the one process
manager for every server the trainer starts (HF and vLLM), and the per-version weight files
they load."""
