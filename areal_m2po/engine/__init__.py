"""Models and their compute: the trainable engine (:mod:`~areal_m2po.engine.train_engine`,
with its forward passes, packing, precision and optimizer step; its placement backends DDP and
FSDP2 in :mod:`~areal_m2po.engine.backends`; LoRA as an adapter on either,
:mod:`~areal_m2po.engine.lora`), the in-process rollout engine and the SGLang-protocol rollout
server and client. Knows nothing about PPO."""
