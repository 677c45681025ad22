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
``areal.trainer.dpo.dpo_engine``           :mod:`areal_m2po.areal.trainer` (``compute_dpo_loss``)
``areal.trainer.ppo.actor``                :mod:`areal_m2po.areal.trainer`
                                           (``compute_prox_logp_approximations``)
=========================================  =================================================

So ``from areal.utils.data import Normalization`` becomes
``from areal_m2po.areal.utils.data import Normalization``. The maths lives in
:mod:`areal_m2po.algo` (pure torch); these modules only give it AReaL's names. Importing a
module here loads nothing heavy beyond what its names need.
"""
