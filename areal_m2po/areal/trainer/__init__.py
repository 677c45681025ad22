"""AReaL's ``areal.trainer`` pure functions (see :mod:`areal_m2po.areal`)."""

_TRAINERS = {
    "PPOTrainer": "areal_m2po.areal.trainer.rl_trainer",
    "SFTTrainer": "areal_m2po.areal.trainer.sft_trainer",
    "RWTrainer": "areal_m2po.areal.trainer.rw_trainer",
    "DPOTrainer": "areal_m2po.areal.trainer.dpo_trainer",
}


def __getattr__(name: str) -> object:
    """AReaL's trainers (``_TRAINERS``), loaded on first use as AReaL's are."""
    import importlib

    if name in _TRAINERS:
        return getattr(importlib.import_module(_TRAINERS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
