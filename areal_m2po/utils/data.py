"""The rollout batch layout and micro-batch splitting.

A batch is a ``dict[str, torch.Tensor]`` whose tensors share the leading dimension B (one row per
generated sequence, the ``n_samples`` of a prompt on consecutive rows). Per-token tensors are
``[B, T]`` in the layout HF ``generate`` returns: left-padded prompt, then the completion from a
column ``P`` common to all rows, then right padding after EOS::

    input_ids       int64 [B, T]   token ids (pad where attention_mask is False)
    attention_mask  bool  [B, T]   True on real tokens
    loss_mask       bool  [B, T]   True on generated tokens (EOS included)
    behave_logp     float [B, T]   behaviour log-prob of each generated token (0 elsewhere), nats
    versions        int64 [B, T]   policy version that generated each token (-1 elsewhere)
    rewards         float [B]      sequence reward
    no_eos          bool  [B]      True when the sample hit max_new_tokens without EOS

Per-token values are aligned to the token: ``x[b, t]`` belongs to ``input_ids[b, t]``.
"""

from __future__ import annotations

import torch

Batch = dict[str, torch.Tensor]

LEGACY_KEYS = {"logprobs": "behave_logp"}
"""Old batch key -> its current name: recover checkpoints that hold the behaviour log-probs
under ``logprobs`` hold queued batches with that key."""


def with_current_keys(batch: Batch) -> Batch:
    """``batch`` with every :data:`LEGACY_KEYS` key renamed (the same dict when none is there).

    Raises:
        KeyError: the batch holds both an old key and its new name.
    """
    old = [k for k in LEGACY_KEYS if k in batch]
    if not old:
        return batch
    clash = [k for k in old if LEGACY_KEYS[k] in batch]
    if clash:
        raise KeyError(f"batch holds both {clash[0]!r} and {LEGACY_KEYS[clash[0]]!r}")
    return {LEGACY_KEYS.get(k, k): v for k, v in batch.items()}


def batch_size(batch: Batch) -> int:
    return int(batch["input_ids"].shape[0])


def select_rows(batch: Batch, index: torch.Tensor | list[int]) -> Batch:
    """The rows ``index`` of every tensor (same order)."""
    idx = torch.as_tensor(index, dtype=torch.long)
    return {k: v.index_select(0, idx.to(v.device)) for k, v in batch.items()}


def completion_start(batch: Batch) -> int:
    """The column ``P`` where completions start (first column with a generated token)."""
    cols = batch["loss_mask"].any(0)
    if not bool(cols.any()):
        return int(batch["input_ids"].shape[1])
    return int(cols.to(torch.int8).argmax())


def seq_lengths(batch: Batch) -> torch.Tensor:
    """Real tokens per row, int64 [B] (summed over every dimension after the first: a row of
    preference pairs, ``[P, 2, T]``, counts its chosen and rejected tokens together)."""
    return batch["attention_mask"].flatten(1).sum(-1)


def split_microbatches(
    batch: Batch, n_mbs: int = 1, max_tokens_per_mb: int | None = None, group_size: int = 1
) -> list[torch.Tensor]:
    """Row indices of each micro-batch.

    The rows are taken in groups of ``group_size`` consecutive rows that always share a
    micro-batch (e.g. a preference pair's chosen and rejected rows: ``group_size=2``); a group
    counts as long as its longest row. Groups are sorted by length (so a micro-batch pads
    little) and cut into at least ``n_mbs`` pieces, more where the padded size ``rows x longest
    row`` would exceed ``max_tokens_per_mb``. A single group longer than the budget gets a
    micro-batch of its own. Each micro-batch lists its rows in ascending order.
    """
    n = batch_size(batch)
    if n == 0:
        return []
    if group_size < 1 or n % group_size:
        raise ValueError(f"{n} rows do not split into groups of group_size={group_size}")
    lengths = seq_lengths(batch).view(-1, group_size).max(-1).values
    order = torch.argsort(lengths, descending=True, stable=True)
    groups: list[list[int]] = []
    if max_tokens_per_mb is not None:
        current: list[int] = []
        longest = 0
        for i in order.tolist():
            cand_longest = max(longest, int(lengths[i]))
            if current and cand_longest * group_size * (len(current) + 1) > max_tokens_per_mb:
                groups.append(current)
                current, cand_longest = [], int(lengths[i])
            current.append(i)
            longest = cand_longest
        if current:
            groups.append(current)
    else:
        groups = [order.tolist()]
    # split the largest pieces until there are at least n_mbs (never more than the groups)
    target = min(max(n_mbs, len(groups)), len(lengths))
    while len(groups) < target:
        big = max(range(len(groups)), key=lambda j: len(groups[j]))
        g = groups.pop(big)
        half = (len(g) + 1) // 2
        groups[big:big] = [g[:half], g[half:]]
    rows = [
        sorted(r for i in g for r in range(i * group_size, (i + 1) * group_size)) for g in groups
    ]
    return [torch.tensor(r, dtype=torch.long) for r in rows]


def trim_columns(batch: Batch) -> tuple[Batch, int, int]:
    """Drop the columns that are padding in every row.

    Returns the trimmed batch and the kept column range ``[left, right)`` of the original.
    """
    cols = batch["attention_mask"].any(0)
    if not bool(cols.any()):
        return batch, 0, 0
    idx = torch.nonzero(cols).flatten()
    left, right = int(idx[0]), int(idx[-1]) + 1
    return {k: (v[:, left:right] if v.dim() == 2 else v) for k, v in batch.items()}, left, right
