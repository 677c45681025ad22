"""AReaL's ``areal.api`` names that library calls take (see :mod:`areal_m2po.areal`)."""
