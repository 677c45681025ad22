"""AReaL's ``areal.trainer.dpo.dpo_engine`` loss functions (areal-project/AReaL cbff54d6):
:func:`compute_dpo_loss` and its pair helpers (:mod:`areal_m2po.algo.areal_trainer_maths`).
AReaL's ``DPOEngine``/``DPOController`` are its trainer; this package's is ``train_dpo``."""

from areal_m2po.algo.areal_trainer_maths import (
    _dpo_loss_weight,
    _dpo_valid_pairs,
    compute_dpo_loss,
    dpo_pair_stats,
)

__all__ = ["_dpo_loss_weight", "_dpo_valid_pairs", "compute_dpo_loss", "dpo_pair_stats"]
