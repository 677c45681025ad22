"""Grouping token sequences by their common prefixes: the index maths of prefix sharing.

Prompts of one batch often share a head (a chat template, a system prompt, few-shot examples)
and then differ. :func:`build_prefix_levels` arranges a list of sequences as a radix tree (each
edge a run of tokens common to every sequence below it) and flattens it into *levels*: level 0
holds the top edges, level ``d`` the edges below those of level ``d - 1``. A model runs level 0
with ``use_cache=True``, selects its cache rows by ``parent`` of level 1
(``Cache.batch_select_indices``), runs level 1 on top, and so on: every shared run of tokens is
computed once, and the last level's cache row ``leaf[i]`` holds sequence ``i``'s keys and values.

Layout: each level's segments are right-padded to the level's width, so a node's cache row is
the concatenation of its ancestors' segments with padding between them (``mask`` zero there);
a sequence that ends above the deepest level continues through empty segments. Positions are
``offset + (index within the segment)``, ``offset`` counting the real tokens above.

An edge is split out only where it pays: shared by ``k`` sequences it saves ``(k - 1) x length``
token computations, against one more forward call and a cache copy per level;
``min_saved_tokens`` is the break-even (measured in docs/performance.md), below it the edge is
merged into its children. Pure index maths: no model, CPU tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["MIN_SAVED_TOKENS", "Level", "PrefixLevels", "build_prefix_levels", "common_prefix"]

# token computations an edge must save to be run on its own (measured: docs/performance.md)
MIN_SAVED_TOKENS = 40


@dataclass
class Level:
    """One level of segments.

    Attributes:
        ids: int64 ``[N, W]`` each node's tokens, right-padded with 0.
        mask: int64 ``[N, W]`` 1 on real tokens.
        parent: int64 ``[N]`` the node's row in the previous level (level 0: ``arange(N)``).
        offset: int64 ``[N]`` real tokens above the segment (its first position).
    """

    ids: torch.Tensor
    mask: torch.Tensor
    parent: torch.Tensor
    offset: torch.Tensor


@dataclass
class PrefixLevels:
    """Levels of a radix tree and, per input sequence, its node in the last level (``leaf``,
    int64 ``[n_sequences]``). ``computed`` counts the real tokens the levels hold (each shared
    run once), ``total`` those of the sequences."""

    levels: list[Level]
    leaf: torch.Tensor
    computed: int
    total: int


@dataclass
class _Node:
    start: int  # first token (index into its sequences) of the edge
    end: int  # one past the edge's last token
    seqs: list[int]  # the distinct sequences below (an index into them)
    children: list[_Node] = field(default_factory=list)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _grow(seqs: list[list[int]], members: list[int], start: int) -> _Node:
    """The radix-tree node of ``members`` (distinct sequences agreeing before ``start``)."""
    if len(members) == 1:
        return _Node(start, len(seqs[members[0]]), members)
    first = seqs[members[0]]
    end = min(len(seqs[m]) for m in members)
    for m in members[1:]:
        end = start + common_prefix(first[start:end], seqs[m][start:end])
    node = _Node(start, end, members)
    groups: dict[int | None, list[int]] = {}
    for m in members:
        key = seqs[m][end] if len(seqs[m]) > end else None
        groups.setdefault(key, []).append(m)
    for key, sub in groups.items():
        # a sequence ending here continues through an empty child of its own
        node.children.append(_Node(end, end, sub) if key is None else _grow(seqs, sub, end))
    return node


def _prune(node: _Node, min_saved: float) -> list[_Node]:
    """``node`` with its sub-tree pruned, or its children (the edge's tokens pushed down into
    each) where its edge saves fewer than ``min_saved`` token computations."""
    if not node.children:
        return [node]
    node.children = [c for child in node.children for c in _prune(child, min_saved)]
    saved = (len(node.seqs) - 1) * (node.end - node.start)
    if saved >= min_saved:
        return [node]
    for child in node.children:
        child.start = node.start
    return node.children


def _depth(node: _Node) -> int:
    return 1 + max((_depth(c) for c in node.children), default=0)


def build_prefix_levels(
    sequences: Sequence[Sequence[int]], min_saved_tokens: float = MIN_SAVED_TOKENS
) -> PrefixLevels:
    """Levels that compute every run of tokens shared by several of ``sequences`` once
    (where it saves at least ``min_saved_tokens``; identical sequences always share one leaf).

    Args:
        sequences: token ids, each non-empty (no padding: the caller strips it).
        min_saved_tokens: the smallest saving, ``(sharers - 1) x run length``, for which a run
            is split out; ``float("inf")`` gives one level of the distinct sequences.
    Raises:
        ValueError: no sequence, or an empty one.
    """
    if not sequences:
        raise ValueError("build_prefix_levels: no sequences")
    distinct: dict[tuple[int, ...], int] = {}
    seq_of_input = []
    for i, s in enumerate(sequences):
        if len(s) == 0:
            raise ValueError(f"build_prefix_levels: sequence {i} is empty")
        seq_of_input.append(distinct.setdefault(tuple(int(t) for t in s), len(distinct)))
    seqs = [list(s) for s in distinct]
    root = _grow(seqs, list(range(len(seqs))), 0)
    tops = [root] if root.end > root.start else root.children
    tops = [n for top in tops for n in _prune(top, min_saved_tokens)]
    levels, leaf_of_seq = _flatten(seqs, tops)
    total = sum(len(s) for s in sequences)
    computed = sum(int(lv.mask.sum()) for lv in levels)
    leaf = leaf_of_seq[torch.tensor(seq_of_input, dtype=torch.long)]
    return PrefixLevels(levels, leaf, computed, total)


def _flatten(seqs: list[list[int]], tops: list[_Node]) -> tuple[list[Level], torch.Tensor]:
    """The levels of the trees ``tops`` and each distinct sequence's row in the last level;
    a leaf above the deepest level continues through empty segments."""
    depth = max(_depth(n) for n in tops)
    current = [(n, -1, 0) for n in tops]  # (node, parent row, offset)
    leaf_of_seq = torch.zeros(len(seqs), dtype=torch.long)
    levels = []
    for d in range(depth):
        width = max(max(n.end - n.start for n, _, _ in current), 1)
        ids = torch.zeros(len(current), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        nxt: list[tuple[_Node, int, int]] = []
        for row, (node, _, off) in enumerate(current):
            length = node.end - node.start
            if length:
                ids[row, :length] = torch.tensor(seqs[node.seqs[0]][node.start : node.end])
                mask[row, :length] = 1
            if d == depth - 1:
                leaf_of_seq[node.seqs] = row
            elif node.children:
                nxt.extend((c, row, off + length) for c in node.children)
            else:  # a leaf above the deepest level: carried down through empty segments
                nxt.append((_Node(0, 0, node.seqs), row, off + length))
        parent = torch.tensor([p if p >= 0 else r for r, (_, p, _) in enumerate(current)])
        offset = torch.tensor([off for _, _, off in current], dtype=torch.long)
        levels.append(Level(ids, mask, parent.long(), offset))
        current = nxt
    return levels, leaf_of_seq
