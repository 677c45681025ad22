"""Servers this package runs: the HF rollout server (SGLang's protocol) and the one process
manager for every server the trainer starts (HF and vLLM). The weight files they load and the
gate in front of them live in :mod:`areal_m2po.rollout.common`, which the engines use too."""
