"""AReaL's ``areal.trainer`` pure functions (see :mod:`areal_m2po.areal`)."""


def __getattr__(name: str) -> object:
    """``PPOTrainer`` and ``SFTTrainer`` load on first use (AReaL's lazy export)."""
    if name == "PPOTrainer":
        from areal_m2po.areal.trainer.rl_trainer import PPOTrainer

        return PPOTrainer
    if name == "SFTTrainer":
        from areal_m2po.areal.trainer.sft_trainer import SFTTrainer

        return SFTTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
