"""AReaL's ``areal.trainer.ppo`` (see :mod:`areal_m2po.areal.trainer.ppo.actor`)."""
