"""AReaL's ``areal.trainer`` pure functions (see :mod:`areal_m2po.areal`)."""
