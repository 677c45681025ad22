"""Sequence packing for the training forward: no padding tokens through the model.

The rollout layout (:mod:`areal_m2po.utils.data`) pads every row to a common width: the prompt
on the left, the completion on the right. :func:`pack_micro_batch` moves the real tokens of a
micro-batch into packed rows instead, several sequences one after another in a row, with
position ids that restart at 0 for each sequence and no attention mask. Hugging Face models then
keep the sequences apart on their own (transformers >= 5, ``masking_utils``):

* ``sdpa`` / ``eager``: ``create_causal_mask`` sees ``attention_mask=None`` with position ids
  that restart inside a row (``find_packed_sequence_indices``) and builds the block-diagonal
  causal mask of each row. Rows are filled up to the longest sequence of the micro-batch (first
  fit, longest first), so the attention cost per row is that of the padded layout while the
  number of rows, and so the tokens through every linear layer, shrinks to the real tokens.
* flash attention (``flash_attention_2``/``_3``): its variable-length kernel only handles one
  packed row (``_is_packed_sequence`` requires batch size 1), so everything goes into a single
  row and the cumulative sequence lengths are handed over (``cu_seq_lens_q/k``,
  ``max_length_q/k``), which also avoids the per-layer device sync of inferring them.

Only the positions that predict a loss token go through the LM head (``logits_to_keep`` as a
boolean ``[rows, width]`` mask, which transformers flattens to ``[n_kept, vocab]``).

Everything here is index bookkeeping on the CPU; the caller moves the tensors to the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PackedLayout", "is_flash_attention", "pack_micro_batch"]


@dataclass
class PackedLayout:
    """A micro-batch packed into rows, and the way back to the padded ``[b, T]`` grid.

    Attributes:
        input_ids: int64 ``[R, C]`` packed token ids (``pad_id`` after the last sequence of a row).
        position_ids: int64 ``[R, C]`` position of each token inside its own sequence; the tail
            padding of a row counts as one more (ignored) sequence starting at 0.
        logits_to_keep: bool ``[R, C]``, True at positions whose next token is a loss token.
        labels: int64 ``[K]`` the token each kept position predicts, in row-major order of the
            kept positions (the order of the LM head's output rows).
        dst_rows, dst_cols: int64 ``[K]`` where each of the ``K`` results lands in ``[b, T]``.
        cu_seqlens: int32 ``[S + 1]`` cumulative sequence lengths over the flattened rows (the
            tail padding of a row, if any, is one more sequence); for varlen attention kernels.
        max_seqlen: the longest entry of ``cu_seqlens``' differences.
        n_real: real (non-padding) tokens packed.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    logits_to_keep: torch.Tensor
    labels: torch.Tensor
    dst_rows: torch.Tensor
    dst_cols: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    n_real: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.input_ids.shape[0]), int(self.input_ids.shape[1]))


def is_flash_attention(model: torch.nn.Module) -> bool:
    """True when the model's attention is a flash kernel (varlen over one packed row).

    Looks through wrappers that keep the model in ``.module`` (DDP, FSDP, DeepSpeed).
    """
    for _ in range(4):
        if hasattr(model, "config") or not hasattr(model, "module"):
            break
        inner = model.module
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None) or ""
    return "flash" in str(impl)


def _first_fit_rows(lengths: list[int], capacity: int) -> tuple[list[int], list[int], list[int]]:
    """Row and offset of each sequence (first fit, longest first) and the fill of each row."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    row_of = [0] * len(lengths)
    off_of = [0] * len(lengths)
    fills: list[int] = []
    for i in order:
        n = lengths[i]
        for r, fill in enumerate(fills):
            if fill + n <= capacity:
                row_of[i], off_of[i] = r, fill
                fills[r] = fill + n
                break
        else:
            row_of[i], off_of[i] = len(fills), 0
            fills.append(n)
    return row_of, off_of, fills


def _empty_layout(pad_id: int) -> PackedLayout:
    """The layout of a micro-batch without a real token: one padding token, nothing kept."""
    empty = torch.zeros(0, dtype=torch.long)
    return PackedLayout(
        input_ids=torch.full((1, 1), pad_id, dtype=torch.long),
        position_ids=torch.zeros(1, 1, dtype=torch.long),
        logits_to_keep=torch.zeros(1, 1, dtype=torch.bool),
        labels=empty,
        dst_rows=empty,
        dst_cols=empty,
        cu_seqlens=torch.tensor([0, 1], dtype=torch.int32),
        max_seqlen=1,
        n_real=0,
    )


def _place_sequences(
    lengths: list[int], seqs: list[int], single_row: bool
) -> tuple[list[int], list[int], list[int], int]:
    """Where each padded row's sequence goes: ``(row, offset)`` per padded row (0 for rows
    without a token), the fill of each packed row, and the packed row width.

    ``single_row``: every sequence of ``seqs`` one after another in row 0, width their total;
    otherwise first fit, longest first, into rows as wide as the longest sequence.
    """
    row_list = [0] * len(lengths)
    off_list = [0] * len(lengths)
    if single_row:
        fill = 0
        for i in seqs:
            off_list[i] = fill
            fill += lengths[i]
        return row_list, off_list, [fill], fill
    width = max(lengths)
    r_k, o_k, fills = _first_fit_rows([lengths[i] for i in seqs], width)
    for j, i in enumerate(seqs):
        row_list[i], off_list[i] = r_k[j], o_k[j]
    return row_list, off_list, fills, width


def _cu_seqlens(
    seq_rows: list[int],
    seq_offsets: list[int],
    seq_lengths: list[int],
    fills: list[int],
    width: int,
) -> tuple[torch.Tensor, int]:
    """int32 ``[S + 1]`` cumulative sequence lengths over the flattened rows, and the longest.

    Sequences are listed row by row in offset order; the unused tail of a row (``width`` minus
    its fill) is one more segment.
    """
    by_row: list[list[tuple[int, int]]] = [[] for _ in fills]
    for r, off, n in zip(seq_rows, seq_offsets, seq_lengths):
        by_row[r].append((off, n))
    seg_lens: list[int] = []
    for r, fill in enumerate(fills):
        seg_lens.extend(n for _, n in sorted(by_row[r]))
        if fill < width:
            seg_lens.append(width - fill)
    cu = torch.zeros(len(seg_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(seg_lens, dtype=torch.int32).cumsum(0)
    return cu, max(seg_lens)


def _token_destinations(
    attn: torch.Tensor, row_list: list[int], off_list: list[int], width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every real token of ``attn`` (bool ``[b, T]``), row-major so each sequence in order.

    Returns int64 ``[N]`` tensors: its padded row and column, its index inside its own
    sequence, and its index in the flattened ``[rows * width]`` packed layout.
    """
    row_of = torch.tensor(row_list, dtype=torch.long)
    off_of = torch.tensor(off_list, dtype=torch.long)
    src_b, src_t = attn.nonzero(as_tuple=True)
    k = (attn.long().cumsum(1) - 1)[src_b, src_t]
    dest = row_of[src_b] * width + off_of[src_b] + k
    return src_b, src_t, k, dest


def _position_ids(
    dest: torch.Tensor, k: torch.Tensor, fills: list[int], width: int
) -> torch.Tensor:
    """int64 ``[rows * width]`` position ids: ``k`` for the real tokens at ``dest``; the unused
    tail of a row counts from 0 again (a separate, ignored segment)."""
    col = torch.arange(width, dtype=torch.long)
    fill_t = torch.tensor(fills, dtype=torch.long)
    flat_pos = (col[None, :] - fill_t[:, None]).clamp(min=0).reshape(-1)
    flat_pos[dest] = k
    return flat_pos


def pack_micro_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    loss_mask: torch.Tensor,
    single_row: bool = False,
    pad_id: int = 0,
) -> PackedLayout:
    """Pack the real tokens of a padded micro-batch into rows.

    Args:
        input_ids: int ``[b, T]`` padded token ids.
        attention_mask: bool ``[b, T]`` real tokens (contiguous within a row, as generated).
        loss_mask: bool ``[b, T]`` tokens whose log-prob is wanted (a subset of the real ones;
            the first token of a sequence has no prediction and is skipped).
        single_row: put every sequence into one row (flash attention's varlen path); otherwise
            rows hold up to the longest sequence's length.
        pad_id: token id for the unused tail of a row.
    Returns:
        A :class:`PackedLayout` of CPU tensors.
    """
    ids = input_ids.detach().cpu()
    attn = attention_mask.detach().cpu().bool()
    lmask = loss_mask.detach().cpu().bool() & attn
    lengths = attn.sum(1).tolist()
    seqs = [i for i, n in enumerate(lengths) if n > 0]
    if not seqs:
        return _empty_layout(pad_id)
    row_list, off_list, fills, width = _place_sequences(lengths, seqs, single_row)
    n_rows = len(fills)
    src_b, src_t, k, dest = _token_destinations(attn, row_list, off_list, width)
    flat_ids = torch.full((n_rows * width,), pad_id, dtype=torch.long)
    flat_ids[dest] = ids[src_b, src_t].long()
    flat_pos = _position_ids(dest, k, fills, width)

    # the positions that predict a loss token: the token just before it, in the same sequence
    is_loss = lmask[src_b, src_t] & (k > 0)
    pred = dest[is_loss] - 1
    order = torch.argsort(pred)
    pred = pred[order]
    keep = torch.zeros(n_rows * width, dtype=torch.bool)
    keep[pred] = True

    cu, max_seqlen = _cu_seqlens(
        [row_list[i] for i in seqs],
        [off_list[i] for i in seqs],
        [lengths[i] for i in seqs],
        fills,
        width,
    )
    return PackedLayout(
        input_ids=flat_ids.view(n_rows, width),
        position_ids=flat_pos.view(n_rows, width),
        logits_to_keep=keep.view(n_rows, width),
        labels=flat_ids[pred + 1],
        dst_rows=src_b[is_loss][order],
        dst_cols=src_t[is_loss][order],
        cu_seqlens=cu,
        max_seqlen=max_seqlen,
        n_real=int(dest.numel()),
    )
