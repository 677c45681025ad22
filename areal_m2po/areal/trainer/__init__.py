"""AReaL's ``areal.trainer`` pure functions (see :mod:`areal_m2po.areal`)."""


def __getattr__(name: str) -> object:
    """``PPOTrainer`` loads on first use (AReaL's lazy export)."""
    if name == "PPOTrainer":
        from areal_m2po.areal.trainer.rl_trainer import PPOTrainer

        return PPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
