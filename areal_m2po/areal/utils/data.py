"""AReaL's ``areal.utils.data`` (areal-project/AReaL cbff54d6) names that user code imports,
with AReaL's arguments and results: :class:`Normalization` and :class:`KLEstimator`
(:mod:`areal_m2po.areal.utils._norm`) and the padded/packed batch helpers below.

A padded batch is a dict of ``[B, S, ...]`` tensors with a bool ``attention_mask`` ``[B, S]``
(each row's tokens first, then padding); a packed one holds ``[total, ...]`` tensors, int32
``cu_seqlens`` ``[B + 1]`` and ``max_seqlen``.

* :func:`pack_tensor_dict`: padded -> packed (every ``[B, S, ...]`` tensor; others kept).
* :func:`split_padded_tensor_dict_into_mb_list`: a padded batch -> :class:`MicroBatchList` of
  padded micro-batches whose sequences are allocated by token count (first-fit decreasing or
  Karmarkar-Karp, :mod:`areal_m2po.algo.seqpack`), with the forward order and its inverse.
* :func:`pad_sequences_to_tensors`, :func:`pad_and_stack_tensors_along_first_dim`,
  :func:`unpack_sequence`, :func:`reorder_list`: the small helpers around them.

Imports torch and :mod:`areal_m2po.algo` only; keeps no state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.algo.seqpack import get_allocate_fn
from areal_m2po.areal.utils._norm import KLEstimator, Normalization

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

DEFAULT_MAX_TOKENS_PER_MB = int(1e12)


def reorder_list(xs: Sequence[Any], indices: list[int]) -> list[Any]:
    """``[xs[i] for i in indices]``; ``indices`` must be a permutation."""
    if len(set(indices)) != len(xs):
        raise AssertionError(f"indices {indices} are no permutation of {len(xs)} items")
    return [xs[i] for i in indices]


def unpack_sequence(
    x: torch.Tensor,
    cu_seqlens: torch.Tensor | None = None,
    lens: list[int] | None = None,
    dim: int = 0,
) -> tuple[torch.Tensor, ...]:
    """``x`` split along ``dim`` into pieces of ``lens`` (or ``cu_seqlens``' differences)."""
    if lens is not None:
        return torch.split(x, [int(n) for n in lens], dim=dim)
    if cu_seqlens is not None:
        return torch.split(x, (cu_seqlens[1:] - cu_seqlens[:-1]).tolist(), dim=dim)
    raise ValueError("Either cu_seqlens or input_lens must be provided.")


def pad_sequences_to_tensors(
    sequence_list: list[dict[str, Any]], pad_value: float = 0.0
) -> dict[str, Any]:
    """Per-sequence dicts of 1-D values -> ``[B, S]`` tensors right-padded with ``pad_value``,
    plus the bool ``attention_mask`` (each row's length from its first key)."""
    if not sequence_list:
        return {}
    width = max(len(seq) for item in sequence_list for seq in item.values())
    tensors = [v for item in sequence_list for v in item.values() if isinstance(v, torch.Tensor)]
    device = tensors[0].device if tensors else torch.device("cpu")  # lists: the CPU
    out: dict[str, Any] = {}
    for key in sequence_list[0]:
        rows = [torch.as_tensor(item[key], device=device) for item in sequence_list]
        padded = [torch.nn.functional.pad(r, (0, width - len(r)), value=pad_value) for r in rows]
        out[key] = torch.stack(padded)
    lengths = [len(next(iter(item.values()))) for item in sequence_list]
    positions = torch.arange(width, device=device)
    out["attention_mask"] = positions[None, :] < torch.tensor(lengths, device=device)[:, None]
    return out


def pad_and_stack_tensors_along_first_dim(tensor_list: list[torch.Tensor]) -> torch.Tensor:
    """Tensors of equal rank, zero-padded along dim 0 to the longest, stacked: ``[n, L, ...]``."""
    if not all(t.ndim == tensor_list[0].ndim for t in tensor_list):
        raise ValueError("All tensors must have the same number of dimensions.")
    longest = max(t.shape[0] for t in tensor_list)
    pads = [
        torch.nn.functional.pad(t, (0, 0) * (t.ndim - 1) + (0, longest - t.shape[0]), value=0.0)
        for t in tensor_list
    ]
    return torch.stack(pads, dim=0)


def pack_tensor_dict(data: dict[str, Any]) -> dict[str, Any]:
    """``data``'s ``[B, S, ...]`` tensors packed to ``[total, ...]`` (each row's first
    ``attention_mask.sum()`` positions); ``attention_mask`` becomes int32 ``cu_seqlens``
    ``[B + 1]`` and ``max_seqlen`` (int); other values are kept as they are."""
    if "attention_mask" not in data:
        raise AssertionError("Input data must contain 'attention_mask' key.")
    mask = data["attention_mask"]
    if mask.ndim != 2:
        raise AssertionError("Attention mask must be a 2D tensor.")
    bs, width = mask.shape
    lens = mask.sum(dim=1, dtype=torch.int32)
    cu = torch.nn.functional.pad(torch.cumsum(lens, dim=0, dtype=torch.int32), (1, 0))
    keep = torch.arange(width, device=mask.device)[None, :] < lens[:, None].to(mask.device)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "attention_mask":
            out["cu_seqlens"], out["max_seqlen"] = cu, int(lens.max().item())
        elif torch.is_tensor(value) and value.ndim >= 2 and value.shape[:2] == (bs, width):
            out[key] = value[keep]
        else:
            out[key] = value
    return out


@dataclass
class MicroBatchList:
    """Micro-batches of a padded batch.

    Attributes:
        data: the whole batch.
        mb_spec: the spec it was split by (``max_tokens_per_mb`` filled in).
        mbs: the micro-batches (padded dicts; values that are not ``[B, S]`` shared).
        group_lens: tokens per micro-batch.
        forward_indices: batch rows in micro-batch order.
        backward_indices: the inverse permutation (row ``i`` is at ``backward_indices[i]``).
    """

    data: dict[str, Any]
    mb_spec: Any
    mbs: list[dict[str, Any]]
    group_lens: list[int]
    forward_indices: list[int] | None = None
    backward_indices: list[int] | None = None

    def __len__(self) -> int:
        return len(self.mbs)


def allocate_balanced_mbs(mb_spec: Any, lens: list[int]) -> list[list[int]]:
    """Groups of indices of ``lens`` by ``mb_spec.packing_algorithm`` (default "ffd"), each
    sorted, the groups sorted."""
    allocate = get_allocate_fn(getattr(mb_spec, "packing_algorithm", "ffd") or "ffd")
    groups = allocate(
        lens,
        mb_spec.max_tokens_per_mb,
        min_groups=mb_spec.n_mbs,
        n_groups_divisor=getattr(mb_spec, "n_mbs_divisor", 1) or 1,
    )
    return sorted(sorted(g) for g in groups)


class _Spec:
    """``mb_spec`` with ``max_tokens_per_mb`` filled in (the caller's object is not changed)."""

    def __init__(self, spec: Any, max_tokens: int) -> None:
        self._spec, self.max_tokens_per_mb = spec, max_tokens

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def split_padded_tensor_dict_into_mb_list(
    data: dict[str, Any], mb_spec: Any, group: Any = None
) -> MicroBatchList:
    """Split a padded batch into micro-batches of at most ``mb_spec.max_tokens_per_mb`` tokens
    (no limit when None), at least ``mb_spec.n_mbs`` of them and a multiple of
    ``n_mbs_divisor``, rows moved together in blocks of ``granularity``. (AReaL also agrees
    the count across ranks through ``group``; here every rank must pass the same lengths.)

    Raises:
        ValueError: no ``attention_mask``.
        RuntimeError: the batch size is no multiple of ``granularity``; allocation failed.
    """
    if "attention_mask" not in data:
        raise ValueError("Input data must be padded and contain 'attention_mask' key.")
    if mb_spec.max_tokens_per_mb is None:
        mb_spec = _Spec(mb_spec, DEFAULT_MAX_TOKENS_PER_MB)
    mask = data["attention_mask"]
    bs, width = mask.shape
    gran = getattr(mb_spec, "granularity", 1) or 1
    if bs % gran:
        raise RuntimeError(f"Batch size {bs} cannot divide granularity {gran}.")
    seq_lens = mask.sum(1).long().tolist()
    block_lens = mask.view(bs // gran, gran, -1).sum(dim=(1, 2)).long().tolist()
    groups = [
        [r for b in g for r in range(b * gran, (b + 1) * gran)]
        for g in allocate_balanced_mbs(mb_spec, block_lens)
    ]
    split_keys = [
        k
        for k, v in data.items()
        if k == "position_ids" or (torch.is_tensor(v) and v.numel() == bs * width)
    ]
    shared = {k: v for k, v in data.items() if k not in split_keys}
    mbs = [{**{k: data[k][g] for k in split_keys}, **shared} for g in groups]
    forward = [r for g in groups for r in g]
    backward = [0] * bs
    for pos, row in enumerate(forward):
        backward[row] = pos
    return MicroBatchList(
        data=data,
        mb_spec=mb_spec,
        mbs=mbs,
        group_lens=[sum(seq_lens[r] for r in g) for g in groups],
        forward_indices=forward,
        backward_indices=backward,
    )
