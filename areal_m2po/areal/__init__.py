"""AReaL's public import paths for user code, mapped onto this package.

Code written for AReaL (areal-project/AReaL at cbff54d6) imports its helpers from ``areal.X``;
the same names, signatures and results are at ``areal_m2po.areal.X``:

=========================================  =================================================
AReaL                                      here
=========================================  =================================================
``areal.reward``                           :mod:`areal_m2po.areal.reward`
``areal.reward.gsm8k`` / ``.geometry3k``   :mod:`areal_m2po.areal.reward` (same names)
``areal.utils.functional``                 :mod:`areal_m2po.areal.utils.functional`
``areal.utils.data``                       :mod:`areal_m2po.areal.utils.data`
``areal.utils.seqpack``                    :mod:`areal_m2po.areal.utils.seqpack`
``areal.utils.constants``                  :mod:`areal_m2po.areal.utils.constants`
``areal.api.cli_args`` (argument objects)  :mod:`areal_m2po.areal.api.cli_args`
``areal.trainer.dpo.dpo_engine``           :mod:`areal_m2po.areal.trainer.dpo.dpo_engine`
``areal.trainer.ppo.actor``                :mod:`areal_m2po.areal.trainer.ppo.actor`
=========================================  =================================================

So ``from areal.utils.data import Normalization`` becomes
``from areal_m2po.areal.utils.data import Normalization``: every path is AReaL's with
``areal_m2po.`` in front. Only AReaL's pure functions are here (its trainers, engines and
servers are this package's own). The maths lives in
:mod:`areal_m2po.algo` (pure torch); these modules only give it AReaL's names. Importing a
module here loads nothing heavy beyond what its names need.
"""

_TRAINERS = {
    "PPOTrainer": "areal_m2po.areal.trainer.rl_trainer",
    "SFTTrainer": "areal_m2po.areal.trainer.sft_trainer",
    "RWTrainer": "areal_m2po.areal.trainer.rw_trainer",
    "DPOTrainer": "areal_m2po.areal.trainer.dpo_trainer",
}


def __getattr__(name: str) -> object:
    """AReaL's top-level names, loaded on first use: the trainers of ``_TRAINERS`` and
    ``workflow_context`` (:mod:`.infra.workflow_context`)."""
    import importlib

    if name in _TRAINERS:
        return getattr(importlib.import_module(_TRAINERS[name]), name)
    if name == "workflow_context":
        return importlib.import_module("areal_m2po.areal.infra.workflow_context")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
