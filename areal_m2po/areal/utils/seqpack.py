"""AReaL's ``areal.utils.seqpack`` names (areal-project/AReaL cbff54d6), from
:mod:`areal_m2po.algo.seqpack`."""

from areal_m2po.algo.seqpack import (
    PACKING_ALGORITHM_FFD,
    PACKING_ALGORITHM_KK,
    PACKING_ALGORITHMS,
    _kk_partition,
    _KKSet,
    _KKState,
    ffd_allocate,
    get_allocate_fn,
    kk_allocate,
)
from areal_m2po.algo.seqpack import packing_metrics as _compute_packing_metrics

__all__ = [
    "PACKING_ALGORITHMS",
    "PACKING_ALGORITHM_FFD",
    "PACKING_ALGORITHM_KK",
    "_KKSet",
    "_KKState",
    "_compute_packing_metrics",
    "_kk_partition",
    "ffd_allocate",
    "get_allocate_fn",
    "kk_allocate",
]
