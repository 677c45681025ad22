"""Attention over a prefix tree's KV cache without copying the shared keys per row.

:mod:`~areal_m2po.engine.prefix_tree` runs each shared run of prompt tokens once; a plain
``DynamicCache`` then hands every row its own copy of those keys and values
(``batch_select_indices``) and concatenates the whole cache again at every decode step. Here a
:class:`CascadeCache` keeps each level's keys once (``[N_d, H_kv, W_d, D]``, one row per node),
maps every batch row to its node per level, and holds the rows' own columns (the completion, or
the tokens being decoded) in a preallocated buffer written in place. :func:`cascade_attention`
computes a row's attention part by part -- each level against the queries of all rows below
its node at once, then the row's own columns causally -- and merges the parts by their
log-sum-exp, which equals one softmax over all columns up to float rounding.

The model runs it under the attention name :data:`CASCADE` (:func:`cascade_mode`); its cache
``update`` returns a :class:`CascadeKV` in place of the key tensor, which the attention
function recognises (any other key goes to the ordinary ``sdpa`` function with its mask). No
gradient through the decode buffer (written in place); a single forward over the own columns
(the levels, the completions of a training pass) keeps its keys as they are, so gradients flow
through every level as through a plain cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache as _Cache

from areal_m2po.engine.hf_model import model_config

__all__ = ["CASCADE", "CascadeCache", "CascadeKV", "cascade_mode", "cascade_supported"]

CASCADE = "areal_cascade"


@dataclass
class _Level:
    """One frozen level: its node masks (bool ``[N, W]``), each row's node (int64 ``[B]``), the
    additive ``bias`` (float32 ``[N, 1, 1, W]``: 0 on real columns, the lowest finite value on
    padding; None when every column is real), and how the rows are grouped by node:
    ``per_node`` ``m`` when node ``j``'s rows are exactly ``j * m .. j * m + m - 1`` (row i is
    node i when ``m`` is 1); otherwise 0, and ``groups`` int64 ``[N, m]`` (padded with ``B``,
    a zero row) and ``slot`` int64 ``[B]`` each row's place in ``groups.flatten()``."""

    mask: torch.Tensor
    row: torch.Tensor
    bias: torch.Tensor | None
    per_node: int
    groups: torch.Tensor | None = None
    slot: torch.Tensor | None = None


def _grouped(mask: torch.Tensor, row: torch.Tensor) -> _Level:
    """A :class:`_Level` with ``row``'s grouping precomputed (once per layout, not per layer)."""
    n, b = mask.shape[0], row.numel()
    bias = None
    if not bool(mask.all()):
        bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        bias = bias.masked_fill(~mask, torch.finfo(torch.float32).min)[:, None, None, :]
    if b % n == 0:
        m = b // n
        if bool((row == torch.arange(b, device=row.device) // m).all()):
            return _Level(mask, row, bias, m)
    order = torch.argsort(row, stable=True)
    counts = torch.bincount(row, minlength=n)
    m = int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(b, device=row.device) - starts[row[order]]
    groups = torch.full((n, m), b, dtype=torch.long, device=row.device)
    groups[row[order], rank] = order
    slot = torch.empty(b, dtype=torch.long, device=row.device)
    slot[order] = row[order] * m + rank
    return _Level(mask, row, bias, 0, groups, slot)


@dataclass
class CascadeKV:
    """What :meth:`CascadeLayer.update` returns as the "keys": the layer and how many of its own
    columns are this call's queries."""

    layer: CascadeLayer
    n_new: int


class CascadeLayer:
    """One decoder layer's cache: the frozen levels' keys and values (``[N_d, H, W_d, D]``) and
    the rows' own columns in ``own_k``/``own_v`` ``[B, H, capacity, D]`` (``own_len`` used)."""

    def __init__(self, cache: CascadeCache) -> None:
        self.cache = cache
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.own_k: torch.Tensor | None = None
        self.own_v: torch.Tensor | None = None
        self.own_len = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> CascadeKV:
        s = k.shape[-2]
        need = self.own_len + s
        if self.own_len == 0 and self.cache.capacity <= s:  # one call: no copy, no in-place
            self.own_k, self.own_v, self.own_len = k, v, s
            return CascadeKV(self, s)
        if self.own_k is None or self.own_k.shape[-2] < need:
            grown = 2 * self.own_k.shape[-2] if self.own_k is not None else 0
            cap = max(need, self.cache.capacity, grown)
            new_k = k.new_zeros(k.shape[0], k.shape[1], cap, k.shape[-1])
            new_v = v.new_zeros(v.shape[0], v.shape[1], cap, v.shape[-1])
            if self.own_k is not None and self.own_len:
                new_k[:, :, : self.own_len] = self.own_k[:, :, : self.own_len]
                new_v[:, :, : self.own_len] = self.own_v[:, :, : self.own_len]  # type: ignore[index]
            self.own_k, self.own_v = new_k, new_v
        self.own_k[:, :, self.own_len : need] = k
        self.own_v[:, :, self.own_len : need] = v  # type: ignore[index]
        self.own_len = need
        return CascadeKV(self, s)

    def freeze(self) -> None:
        """The own columns become the newest level (one node per row)."""
        assert self.own_k is not None and self.own_v is not None
        self.keys.append(self.own_k[:, :, : self.own_len])
        self.values.append(self.own_v[:, :, : self.own_len])
        self.own_k = self.own_v = None
        self.own_len = 0


class CascadeCache(_Cache):
    """A KV cache for a model run under :data:`CASCADE`: levels shared by rows, own columns per
    row. Use: ``start(n_layers)``, then per prefix level a forward and :meth:`freeze` with its
    mask, :meth:`select` the next rows by their parent, and a last forward (or ``generate``)
    over the own columns."""

    is_compileable = False

    def __init__(self, n_layers: int, capacity: int = 0) -> None:
        # transformers' Cache (generate checks the type); its layer machinery is not used
        self.own_layers = [CascadeLayer(self) for _ in range(n_layers)]
        self.layers = self.own_layers  # type: ignore[assignment]
        self.layer_class_to_replicate = None
        self.offloading = False
        self.levels: list[_Level] = []
        self.capacity = capacity

    # -- what the model and generate call ----------------------------------------------------
    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *a: Any, **kw: Any) -> Any:  # type: ignore[override]
        kv = self.own_layers[layer_idx].update(k, v)
        return kv, kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return sum(int(lv.mask.shape[1]) for lv in self.levels) + self.own_layers[layer_idx].own_len

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.get_seq_length(layer_idx) + query_length, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.get_seq_length(layer_idx)

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.layers)

    # -- building the levels -------------------------------------------------------------------
    def seed(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """A first level of one node computed elsewhere: per layer ``[1, H, c, D]``."""
        for layer, k, v in zip(self.own_layers, keys, values, strict=True):
            layer.keys.append(k)
            layer.values.append(v)
        c = keys[0].shape[-2]
        mask = torch.ones(1, c, dtype=torch.bool, device=keys[0].device)
        self.levels.append(_grouped(mask, torch.zeros(1, dtype=torch.long, device=mask.device)))

    def freeze(self, mask: torch.Tensor) -> None:
        """The own columns just computed become a level; ``mask`` bool ``[N, W]`` its real
        tokens (the rows are its nodes)."""
        for layer in self.own_layers:
            layer.freeze()
        n = mask.shape[0]
        self.levels.append(_grouped(mask.bool(), torch.arange(n, device=mask.device)))

    def select(self, rows: torch.Tensor) -> None:
        """The next rows are ``rows`` (int64 ``[B']``) of the current ones, before any own
        column of theirs exists."""
        if any(layer.own_len for layer in self.own_layers):
            raise ValueError("CascadeCache.select: freeze the own columns first")
        self.levels = [_grouped(lv.mask, lv.row[rows]) for lv in self.levels]

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Go on with the rows ``rows`` (int64 ``[B']``, increasing) of the current ones, their
        own columns included: rows that finished decoding stop costing compute. A level's nodes
        left without a row are dropped from it (their keys and values with them)."""
        for layer in self.own_layers:
            if layer.own_k is not None and layer.own_v is not None:
                layer.own_k = layer.own_k.index_select(0, rows)
                layer.own_v = layer.own_v.index_select(0, rows)
        levels = []
        for depth, lv in enumerate(self.levels):
            row, mask = lv.row[rows], lv.mask
            used, row_of_used = torch.unique(row, return_inverse=True)
            if used.numel() < mask.shape[0]:
                for layer in self.own_layers:
                    layer.keys[depth] = layer.keys[depth].index_select(0, used)
                    layer.values[depth] = layer.values[depth].index_select(0, used)
                mask, row = mask[used], row_of_used
            levels.append(_grouped(mask, row))
        self.levels = levels


def _part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``q`` ``[N, H, M, D]`` over ``k``/``v`` ``[N, H, W, D]`` with an
    additive ``bias`` (0 where allowed, broadcast to ``[N, H, M, W]``; None: every column): the
    normalised output ``[N, H, M, D]`` and the log-sum-exp ``[N, H, M]``. Masked columns carry
    the dtype's lowest finite value, not -inf: a fully masked row (an empty segment) then gets
    an lse of about that value, so its merge weight is 0 and every gradient finite. One pass
    each for the maximum, the exponentials and their sum serves both results."""
    scores = torch.matmul(q * scale, k.transpose(-1, -2))
    if bias is not None:
        scores = scores + bias
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights, v) / total
    return out, (top + torch.log(total))[..., 0]


def _level_part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lv: _Level, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One level's part for the rows' queries ``q`` ``[B, Hkv, G, D]`` (``G`` = group x
    queries): each node's keys once, against all its rows' queries together."""
    b, h, g, d = q.shape
    bias = None if lv.bias is None else lv.bias.to(q.dtype)
    n = lv.mask.shape[0]
    if lv.per_node == 1:
        return _part(q, k, v, bias, scale)
    if lv.per_node:  # node j's rows are a contiguous block of m
        m = lv.per_node
        qx = q.view(n, m, h, g, d).transpose(1, 2).reshape(n, h, m * g, d)
        out, lse = _part(qx, k, v, bias, scale)
        out = out.view(n, h, m, g, d).transpose(1, 2).reshape(b, h, g, d)
        return out, lse.view(n, h, m, g).transpose(1, 2).reshape(b, h, g)
    assert lv.groups is not None and lv.slot is not None
    m = lv.groups.shape[1]
    qx = torch.cat([q, q.new_zeros(1, h, g, d)])[lv.groups.flatten()]  # [N*m, H, G, D]
    qx = qx.view(n, m, h, g, d).transpose(1, 2).reshape(n, h, m * g, d)
    out, lse = _part(qx, k, v, bias, scale)
    out = out.view(n, h, m, g, d).transpose(1, 2).reshape(n * m, h, g, d)[lv.slot]
    lse = lse.view(n, h, m, g).transpose(1, 2).reshape(n * m, h, g)[lv.slot]
    return out, lse


def cascade_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: Any,
    value: Any,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function registered as :data:`CASCADE`: ``query`` ``[B, Hq, S, D]``
    against a :class:`CascadeKV` (levels, then the own columns causally), output
    ``[B, S, Hq, D]``; a plain key tensor goes to transformers' ``sdpa`` function."""
    if not isinstance(key, CascadeKV):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, **kwargs
        )
    layer, s = key.layer, key.n_new
    b, hq, _, d = query.shape
    work = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    own_k = layer.own_k[:, :, : layer.own_len].to(work)  # type: ignore[index]
    own_v = layer.own_v[:, :, : layer.own_len].to(work)  # type: ignore[index]
    h = own_k.shape[1]
    g = hq // h
    scale = float(scaling) if scaling is not None else d**-0.5
    q = query.to(work).reshape(b, h, g * s, d)
    t = layer.own_len
    bias = None
    if s > 1:  # one query sees every own column: no causal mask
        causal = (
            torch.arange(t, device=q.device)[None, :]
            > torch.arange(t - s, t, device=q.device)[:, None]
        )
        bias = torch.zeros(s, t, dtype=work, device=q.device)
        bias = bias.masked_fill(causal, torch.finfo(work).min).repeat(g, 1)
    out, lse = _part(q, own_k, own_v, bias, scale)
    for lv, k, v in zip(layer.cache.levels, layer.keys, layer.values):
        o2, l2 = _level_part(q, k.to(work), v.to(work), lv, scale)
        merged = torch.logaddexp(lse, l2)
        out = out * torch.exp(lse - merged)[..., None] + o2 * torch.exp(l2 - merged)[..., None]
        lse = merged
    out = out.reshape(b, hq, s, d).transpose(1, 2).contiguous()
    return out.to(query.dtype), None


def _register() -> None:
    """Make :data:`CASCADE` a valid attention name (idempotent; its masks as ``sdpa``'s, for
    a forward under the name without a cascade cache)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if CASCADE not in ALL_ATTENTION_FUNCTIONS:
        ALL_ATTENTION_FUNCTIONS.register(CASCADE, cascade_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(CASCADE, sdpa_mask)


def cascade_supported(model: torch.nn.Module) -> bool:
    """Whether the model's attention is a plain causal softmax that :func:`cascade_attention`
    reproduces: ``sdpa`` or ``eager``, no sliding window, no logit soft-capping, no sinks."""
    cfg = model_config(model)
    if getattr(cfg, "_attn_implementation", None) not in ("sdpa", "eager", CASCADE):
        return False
    if getattr(cfg, "sliding_window", None) is not None and getattr(
        cfg, "use_sliding_window", True
    ):
        return False
    if getattr(cfg, "attn_logit_softcapping", None) or getattr(cfg, "is_encoder_decoder", False):
        return False
    return not any(hasattr(m, "sinks") for m in model.modules())


@contextlib.contextmanager
def cascade_mode(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` under :data:`CASCADE` inside the block (restored after, also on error)."""
    _register()
    cfg = model_config(model)
    before = cfg._attn_implementation
    cfg._attn_implementation = CASCADE
    try:
        yield
    finally:
        cfg._attn_implementation = before
