"""Reading AReaL's config files (AReaL's ``PPOConfig``/``GRPOConfig`` and its SFT, RW and DPO
configs): the AReaL wing's config readers, which only :mod:`areal_m2po.api.config_loader`
imports. :mod:`.config` reads RL files (with :mod:`.sections` for the sections that take more
than a rename), :mod:`.trainer_config` SFT, RW and DPO files; :mod:`.tree` holds the helpers
they share."""
