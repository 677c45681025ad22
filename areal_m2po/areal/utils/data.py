"""AReaL's ``areal.utils.data`` names (areal-project/AReaL cbff54d6) that user code imports:
:class:`Normalization` (:mod:`areal_m2po.algo.areal_norm`), :class:`KLEstimator`
(:mod:`areal_m2po.algo.areal_functional`) and the batch helpers of
:mod:`areal_m2po.algo.areal_data`."""

from areal_m2po.algo.areal_data import (
    DEFAULT_MAX_TOKENS_PER_MB,
    MicroBatchList,
    allocate_balanced_mbs,
    pack_tensor_dict,
    pad_and_stack_tensors_along_first_dim,
    pad_sequences_to_tensors,
    reorder_list,
    split_padded_tensor_dict_into_mb_list,
    unpack_sequence,
)
from areal_m2po.algo.areal_functional import KLEstimator
from areal_m2po.algo.areal_norm import Normalization

__all__ = [
    "DEFAULT_MAX_TOKENS_PER_MB",
    "KLEstimator",
    "MicroBatchList",
    "Normalization",
    "allocate_balanced_mbs",
    "pack_tensor_dict",
    "pad_and_stack_tensors_along_first_dim",
    "pad_sequences_to_tensors",
    "reorder_list",
    "split_padded_tensor_dict_into_mb_list",
    "unpack_sequence",
]
