"""The sections of the configuration tree, one module per part of a run, in the manner of
torchtitan's job config. :mod:`areal_m2po.api.cli_args` is the public module that gathers
them (import from there); these modules import each other only downwards:

* :mod:`.checks`: the field helpers (``help``/``choices`` metadata) and the value checks;
* :mod:`.engine`: a trained model's engine (optimizer, micro-batches, FSDP2, LoRA);
* :mod:`.actor`: the PPO actor (loss, M2PO, rewards and advantages);
* :mod:`.models`: the other models of a PPO run (critic, reference, teacher);
* :mod:`.rollout`: generation, the rollout engines and servers;
* :mod:`.data`: datasets and rewards;
* :mod:`.output`: saving, recovery, evaluation and metric logging;
* :mod:`.run`: the run fields every trainer shares;
* :mod:`.ppo`, :mod:`.trainers`: the root configs of the PPO, reward-model, SFT and DPO trainers.

Building a config object only checks values: files, packages and models are checked at start-up
(:mod:`areal_m2po.trainer.preflight`).
"""
