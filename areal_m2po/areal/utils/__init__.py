"""AReaL's ``areal.utils`` modules of pure functions user code imports (see
:mod:`areal_m2po.areal`)."""
