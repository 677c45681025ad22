"""Models and their compute: the trainable engine (:mod:`~areal_m2po.engine.train_engine`,
with its forward passes, packing, FSDP2, LoRA and optimizer), the in-process rollout engine
and the SGLang-protocol rollout server and client. Knows nothing about PPO."""
