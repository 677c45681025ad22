"""Scoring a micro-batch with each distinct prompt run through the model once.

A GRPO batch holds ``n_samples`` completions of every prompt, so a plain forward pass runs each
prompt ``n_samples`` times. On the built-in demo (47-token prompts, 16 new tokens, groups of 8)
that is 504 tokens per group where 47 + 8 x 16 = 175 carry the information:
:func:`forward_logprobs_shared_prefix` runs the distinct prompts once (``use_cache=True``),
gives every row its prompt's KV cache (``Cache.batch_select_indices``) and runs only the
completion columns on top of it. The log-probs equal the plain pass's up to float rounding (the
matrix products see other shapes); :func:`shared_prefix_verdict` checks that once per model.

The batch layout it relies on is the trainer's: prompts left-padded to a common column ``P``
(:func:`~areal_m2po.utils.data.completion_start`), completions from there, right-padded.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from areal_m2po.engine.cascade_attention import CascadeCache, cascade_mode, cascade_supported
from areal_m2po.engine.forward import forward_logprobs, token_logprobs
from areal_m2po.engine.hf_model import base_model, model_config
from areal_m2po.engine.prefix_tree import (
    MIN_SAVED_TOKENS,
    PrefixLevels,
    build_prefix_levels,
    common_prefix,
)
from areal_m2po.utils.data import Batch, completion_start, trim_columns

__all__ = [
    "HeadStore",
    "cache_kwarg",
    "forward_logprobs_shared_prefix",
    "level_positions",
    "prefill_levels",
    "prompt_index",
    "shared_prefix_split",
    "shared_prefix_verdict",
    "split_prompt_groups",
]

logger = logging.getLogger("areal_m2po.engine")


def cache_kwarg(model: torch.nn.Module) -> str:
    """The name under which this transformers' forward takes and returns the KV cache:
    ``cache`` in newer releases (which warn on the old name), ``past_key_values`` before.
    Looks through a DDP wrapper (``.module``) and a PEFT model (``get_base_model()``)."""
    params = inspect.signature(type(base_model(model)).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def prompt_index(batch: Batch) -> tuple[int, torch.Tensor] | None:
    """``(P, prompt_of_row)``: the completion column ``P`` and, per row, the index (int64
    ``[B]``, 0-based, in order of first appearance) of its distinct prompt (columns ``< P``,
    padding ignored). None when the layout has no prompt to share: no completion column, an
    empty prompt, or a row whose last prompt column is padding."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    start = completion_start(batch)
    if start >= ids.shape[1] or start == 0 or not bool(attn[:, start - 1].bool().all()):
        return None
    key = ids[:, :start].masked_fill(attn[:, :start] == 0, -1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    # renumber by first appearance, so groups keep the batch's order
    dev = ids.device  # every index on the batch's device (a GPU batch stays there)
    first = torch.full((int(inverse.max()) + 1,), ids.shape[0], dtype=torch.long, device=dev)
    first.scatter_reduce_(0, inverse, torch.arange(ids.shape[0], device=dev), "amin")
    rank = torch.empty_like(first)
    rank[torch.argsort(first)] = torch.arange(first.numel(), device=dev)
    return start, rank[inverse]


def split_prompt_groups(
    batch: Batch, prompt_of_row: torch.Tensor, start: int, max_tokens_per_mb: int | None
) -> list[torch.Tensor]:
    """Row indices of each micro-batch of a shared-prefix pass: prompt groups in order, as many
    per micro-batch as keep the tokens the pass computes within ``max_tokens_per_mb`` (None:
    one micro-batch): a group costs its prompt's tokens past the longest prefix it shares with
    a prompt already in the micro-batch (all ``P`` prompt columns for the first) plus ``rows x
    S`` (``S`` the completion columns). A group larger than the budget is cut into pieces of as
    many rows as fit beside its prompt (at least one), each its own micro-batch: the budget
    bounds a training pass's activations as it does for the plain split. Rows ascend within a
    micro-batch."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    width = int(ids.shape[1]) - start
    budget = max_tokens_per_mb
    pieces: list[list[int]] = []
    current: list[int] = []
    held: list[list[int]] = []  # the prompts of the current micro-batch
    cost = 0
    for g in range(int(prompt_of_row.max()) + 1):
        rows = torch.nonzero(prompt_of_row == g).flatten().tolist()
        prompt = ids[rows[0], :start][attn[rows[0], :start].bool()].tolist()
        if budget is not None and start + len(rows) * width > budget:
            if current:
                pieces.append(current)
                current, held, cost = [], [], 0
            fit = max(1, (budget - start) // max(width, 1))
            pieces.extend(rows[i : i + fit] for i in range(0, len(rows), fit))
            continue
        shared = max((common_prefix(prompt, h) for h in held), default=0)
        extra = (start if not held else len(prompt) - shared) + len(rows) * width
        if current and budget is not None and cost + extra > budget:
            pieces.append(current)
            current, held, cost = [], [], 0
            extra = start + len(rows) * width
        current.extend(rows)
        held.append(prompt)
        cost += extra
    if current:
        pieces.append(current)
    return [torch.tensor(sorted(rows), dtype=torch.long) for rows in pieces]


def shared_prefix_split(batch: Batch, max_tokens_per_mb: int | None) -> list[torch.Tensor] | None:
    """:func:`split_prompt_groups` of ``batch``, or None when there is nothing to share:
    :func:`prompt_index` found no prompt, or every prompt appears once and their common
    prefixes save fewer than ``MIN_SAVED_TOKENS`` token computations (a batch of distinct
    prompts behind one system prompt is still shared)."""
    found = prompt_index(batch)
    if found is None:
        return None
    start, prompt_of_row = found
    if int(prompt_of_row.max()) + 1 == prompt_of_row.numel():
        ids, attn = batch["input_ids"][:, :start], batch["attention_mask"][:, :start].bool()
        tree = build_prefix_levels([row[m].tolist() for row, m in zip(ids, attn)])
        if tree.total - tree.computed < MIN_SAVED_TOKENS:
            return None
    return split_prompt_groups(batch, prompt_of_row, start, max_tokens_per_mb)


def level_positions(mask: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Position ids of a segment: ``offset`` (int64 ``[N]``, real tokens above it) plus each
    token's index among the segment's real tokens (``mask`` ``[N, W]``); padding gets the
    position of the real token before it (its keys are masked)."""
    return offset[:, None] + (mask.cumsum(-1) - 1).clamp(min=0)


@dataclass
class PrefillState:
    """What :func:`prefill_levels` leaves: the KV ``cache`` of the last level's nodes (one row
    each), their accumulated layout (``ids`` and ``mask`` ``[N, columns]``, padding between
    segments), their real-token counts ``length`` ``[N]`` and, where asked for, the logits of
    each node's last real token ``last_logits`` ``[N, V]`` (the next token's prediction)."""

    cache: Any
    ids: torch.Tensor
    mask: torch.Tensor
    length: torch.Tensor
    last_logits: torch.Tensor | None


@dataclass
class HeadStore:
    """The keys and values (per layer ``[1, H, L, D]``) of ``tokens``, a run of prompt tokens
    that began every prompt of an earlier micro-batch of the same no-grad pass (same weights):
    a later micro-batch whose prompts all begin with part of it continues on that part instead
    of running it again (a system prompt computed once per pass, not once per micro-batch)."""

    tokens: list[int] = field(default_factory=list)
    keys: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)

    def reusable(self, prompts: list[list[int]]) -> int:
        """How many leading tokens of every prompt the store holds (at least
        ``MIN_SAVED_TOKENS``, else 0), leaving each prompt one token of its own at least."""
        c = min(len(p) for p in prompts) - 1
        for p in prompts:
            c = min(c, common_prefix(self.tokens[:c], p[:c]))
        return c if c >= MIN_SAVED_TOKENS else 0

    def seed(self, c: int) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """The first ``c`` tokens (int64 ``[c]``) and their keys and values."""
        dev = self.keys[0].device
        cut = [k[:, :, :c] for k in self.keys], [v[:, :, :c] for v in self.values]
        return torch.tensor(self.tokens[:c], dtype=torch.long, device=dev), *cut

    def remember(self, cache: CascadeCache, tree: PrefixLevels, prompt: list[int], c: int) -> None:
        """After a pass that reused ``c`` tokens: keep its top segment, where one node (every
        prompt's head), with the reused part before it."""
        top = tree.levels[0]
        if top.ids.shape[0] != 1:
            return
        n = c + int(top.mask.sum())
        idx = 1 if c else 0
        self.tokens = prompt[:n]
        self.keys = [_joined(layer.keys, idx) for layer in cache.own_layers]
        self.values = [_joined(layer.values, idx) for layer in cache.own_layers]


def _joined(kv: list[torch.Tensor], idx: int) -> torch.Tensor:
    return torch.cat([kv[0], kv[1]], 2) if idx else kv[0]


def prefill_levels(
    model: torch.nn.Module,
    tree: PrefixLevels,
    want_logits: bool,
    cascade: bool = False,
    seed: tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> PrefillState:
    """Run the levels of ``tree`` through ``model`` with ``use_cache=True``, each level on its
    parents' cache rows: a ``DynamicCache`` with the rows copied
    (``Cache.batch_select_indices``), or with ``cascade`` (inside
    :func:`~areal_m2po.engine.cascade_attention.cascade_mode`) a
    :class:`~areal_m2po.engine.cascade_attention.CascadeCache` that keeps each level once.
    ``seed`` (cascade only, from :meth:`HeadStore.seed`): ``c`` tokens every sequence of
    ``tree`` comes after, with their keys and values (the tree's positions start at ``c``)."""
    name = cache_kwarg(model)
    dev = next(model.parameters()).device
    cache: Any = CascadeCache(_n_layers(model)) if cascade else None
    acc_ids, acc_mask, last, base = None, None, None, 0
    if seed is not None:
        cache.seed(seed[1], seed[2])
        acc_ids, base = seed[0][None], int(seed[0].numel())
        acc_mask = torch.ones_like(acc_ids)
    for i, level in enumerate(tree.levels):
        ids, mask = level.ids.to(dev), level.mask.to(dev)
        parent, offset = level.parent.to(dev), level.offset.to(dev) + base
        if i == 0 and seed is not None:
            parent = torch.zeros_like(parent)
        if acc_ids is not None:
            select_rows(cache, parent)
            acc_ids = torch.cat([acc_ids[parent], ids], 1)
            acc_mask = torch.cat([acc_mask[parent], mask], 1)  # type: ignore[index]
        else:
            acc_ids, acc_mask = ids, mask
        seg_len = mask.sum(-1)
        if want_logits:
            # the last real columns by index, not logits_to_keep=1: a slice is a strided view,
            # whose product with the head takes another kernel (other rounding) when the
            # head's weight requires grad, so a policy and its frozen copy would disagree
            cols, which = torch.unique((seg_len - 1).clamp(min=0), return_inverse=True)
            keep: Any = cols
        else:
            keep = torch.empty(0, dtype=torch.long, device=dev)  # no position: no LM head
        out = model(
            input_ids=ids,
            attention_mask=acc_mask,
            position_ids=level_positions(mask, offset),
            use_cache=True,
            logits_to_keep=keep,
            **({name: cache} if cache is not None else {}),
        )
        if cascade:
            cache.freeze(mask)
        else:
            cache = getattr(out, name)
        if want_logits:
            mine = out.logits[torch.arange(ids.shape[0], device=dev), which]
            if last is not None:
                # index_select, not last[parent]: the rows of one prompt repeat its parent, and
                # the backward of advanced indexing adds repeated rows with atomics in thread
                # order (index_put_ accumulate), so 2-thread runs drifted apart (issue 55)
                mine = torch.where((seg_len > 0)[:, None], mine, last.index_select(0, parent))
            last = mine
    length = tree.levels[-1].offset.to(dev) + base + tree.levels[-1].mask.to(dev).sum(-1)
    assert acc_ids is not None and acc_mask is not None
    return PrefillState(cache, acc_ids, acc_mask, length, last)


def select_rows(cache: Any, rows: torch.Tensor) -> None:
    """Continue ``cache`` with the rows ``rows`` (int64 ``[B']``, repeats allowed) of its
    current ones. A transformers ``DynamicCache``'s layers are copied with ``index_select``:
    its own ``batch_select_indices`` indexes ``keys[rows]``, whose backward adds the repeated
    rows' gradients in thread order (not reproducible at 2+ threads)."""
    if isinstance(cache, CascadeCache):
        cache.select(rows)
        return
    layers = getattr(cache, "layers", None)
    if layers is None or not all(_plain_kv(layer) for layer in layers):
        cache.batch_select_indices(rows)
        return
    for layer in layers:
        if layer.keys.numel():
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)


def _plain_kv(layer: Any) -> bool:
    """Whether a cache layer holds its keys and values as two batch-first tensors."""
    keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
    return isinstance(keys, torch.Tensor) and isinstance(values, torch.Tensor)


def _n_layers(model: torch.nn.Module) -> int:
    cfg = model_config(model)
    return int(getattr(cfg, "num_hidden_layers", 0) or cfg.get_text_config().num_hidden_layers)


def forward_logprobs_shared_prefix(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    compute_entropy: bool = True,
    min_saved_tokens: float = MIN_SAVED_TOKENS,
    cascade: bool | None = None,
    head_store: HeadStore | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~areal_m2po.engine.forward.forward_logprobs` with the prompts of ``mb`` grouped by
    their common prefixes (:func:`~areal_m2po.engine.prefix_tree.build_prefix_levels`): every
    shared run of prompt tokens, each distinct prompt among them, is run once, and the
    completions on top of their prompt's KV cache. The same contract (float32 ``[b, T]``
    log-probs and entropies aligned to ``mb["input_ids"]``, zero outside the completion
    columns), equal up to float rounding. ``min_saved_tokens``: where a run shared by several
    prompts is split out (``inf``: distinct prompts only). ``cascade``: keep each level's KV
    once (:mod:`~areal_m2po.engine.cascade_attention`); None: wherever the model's attention
    allows it. ``head_store`` (cascade, no grad): one per pass, shared
    by its micro-batches, so that a head every prompt of one began with is run once per pass
    (:class:`HeadStore`). Falls back to the plain pass when
    :func:`prompt_index` finds no prompt to share."""
    b, full_t = mb["input_ids"].shape
    trimmed, left, _right = trim_columns(mb)
    found = prompt_index(trimmed)
    if found is None:
        return forward_logprobs(model, mb, temperature, compute_entropy)
    start, _ = found
    ids = trimmed["input_ids"]
    attn = trimmed["attention_mask"].long()
    t = ids.shape[1]
    prompts = [
        row[m.bool()].tolist() for row, m in zip(ids[:, :start].cpu(), attn[:, :start].cpu())
    ]
    if cascade is None:
        cascade = cascade_supported(model)
    store = head_store if cascade and not torch.is_grad_enabled() else None
    c = store.reusable(prompts) if store is not None and store.tokens else 0
    tree = build_prefix_levels([p[c:] for p in prompts], min_saved_tokens)
    with cascade_mode(model) if cascade else contextlib.nullcontext():
        seed = store.seed(c) if store is not None and c else None
        state = prefill_levels(model, tree, want_logits=True, cascade=cascade, seed=seed)
        if store is not None:
            store.remember(state.cache, tree, prompts[0], c)
        assert state.last_logits is not None
        leaf = tree.leaf.to(ids.device)
        select_rows(state.cache, leaf)
        s_mask = attn[:, start:]
        out_s = model(
            input_ids=ids[:, start:],
            attention_mask=torch.cat([state.mask[leaf], s_mask], 1),
            position_ids=level_positions(s_mask, state.length[leaf]),
            use_cache=True,
            logits_to_keep=0,
            **{cache_kwarg(model): state.cache},
        )
    # column start's token is predicted by the prompt's last token, column j > start's by j-1
    # index_select, not [leaf]: the rows of a prompt repeat its leaf (see prefill_levels)
    last = state.last_logits.index_select(0, leaf)
    logits = torch.cat([last[:, None], out_s.logits[:, :-1]], dim=1)
    logp, ent = token_logprobs(logits, ids[:, start:], temperature, compute_entropy)
    logp_full = torch.zeros(b, full_t, dtype=torch.float32, device=ids.device)
    ent_full = torch.zeros(b, full_t, dtype=torch.float32, device=ids.device)
    cols = slice(left + start, left + t)
    logp_full[:, cols] = logp.float()
    if ent is not None:  # None exactly when not compute_entropy
        ent_full[:, cols] = ent.float()
    return logp_full, ent_full


@torch.no_grad()
def shared_prefix_verdict(
    model: torch.nn.Module, batch: Batch, temperature: float, low_precision: bool
) -> bool | None:
    """Whether the shared-prefix pass gives the plain pass's log-probs on this model, checked on
    the first prompt group of ``batch`` that has two or more rows (at most 4 of its rows; the
    first prompt's row where every prompt appears once) and the first rows of two other
    prompts, every common prefix split out (``min_saved_tokens=0``, so the check runs the levels
    of a prefix tree wherever the prompts share a head): None (check later) when ``batch`` has
    a single row or no prompt. A model whose KV cache
    does not reproduce its plain forward (a custom attention, a cache without
    ``batch_select_indices``) gets False and a warning."""
    found = prompt_index(batch)
    if found is None:
        return None
    _, prompt_of_row = found
    counts = torch.bincount(prompt_of_row)
    if counts.numel() < 2 and int(counts[0]) < 2:
        return None
    shared = torch.nonzero(counts >= 2).flatten()
    lead = int(shared[0]) if shared.numel() else 0
    rows = torch.nonzero(prompt_of_row == lead).flatten()[:4]
    other = [p for p in range(counts.numel()) if p != lead][:2]
    others = torch.tensor(
        [int(torch.nonzero(prompt_of_row == p)[0]) for p in other],
        dtype=torch.long,
        device=rows.device,
    )
    rows = torch.cat([rows, others])
    sub = {k: v.index_select(0, rows) for k, v in batch.items() if v.dim() >= 1}
    was_training = model.training
    model.eval()
    try:
        plain, _ = forward_logprobs(model, sub, temperature, False)
        try:
            shared_lp, _ = forward_logprobs_shared_prefix(
                model, sub, temperature, False, min_saved_tokens=0
            )
        except (AttributeError, NotImplementedError, TypeError, ValueError) as exc:
            logger.warning("shared-prefix scoring fails on this model (%s); scoring plainly", exc)
            return False
    finally:
        model.train(was_training)
    mask = sub["loss_mask"].bool()
    diff = float((plain[mask] - shared_lp[mask]).abs().max())
    tol = 5e-2 if low_precision else 1e-3
    if diff > tol:
        logger.warning(
            "mb_spec.shared_prefix: log-probs with shared prompts differ from the plain ones by "
            "%.3g on this model (tolerance %.0e); scoring plainly",
            diff,
            tol,
        )
        return False
    logger.info("mb_spec.shared_prefix: shared-prompt scoring checked (max |diff| %.2g)", diff)
    return True
