"""AReaL's ``areal.trainer.dpo`` (see :mod:`areal_m2po.areal.trainer.dpo.dpo_engine`)."""
