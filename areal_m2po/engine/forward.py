"""Per-token forward passes of a causal LM over one micro-batch (padded or packed).

``forward_logprobs`` runs the padded micro-batch; ``forward_logprobs_packed`` packs the
sequences into rows without padding (see :mod:`areal_m2po.engine.packing`). Both return float32
``[b, T]`` log-probs and entropies aligned to ``mb["input_ids"]``.
"""

from __future__ import annotations

from typing import Any

import torch

from areal_m2po.algo.logprobs import gather_logprobs_entropy
from areal_m2po.engine.packing import is_flash_attention, pack_micro_batch
from areal_m2po.utils.data import Batch, completion_start, trim_columns

LOGPROB_CHUNK_BYTES = 32 * 2**20
"""Upper bound on the float32 size of one block of the chunked log-prob/entropy computation."""


def logprob_chunk_rows(n_rows: int, vocab: int) -> int:
    """Rows (tokens) per block of the chunked log-prob/entropy over ``n_rows`` logits rows.

    At most an eighth of the rows, so the block temporaries stay a small fraction of the
    logits tensor however small the batch, and at most :data:`LOGPROB_CHUNK_BYTES` of float32;
    between 16 and 1024 rows.
    """
    by_bytes = LOGPROB_CHUNK_BYTES // (4 * max(vocab, 1))
    return max(16, min(1024, -(-n_rows // 8), by_bytes))


def token_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`gather_logprobs_entropy` with the engine's block size (:func:`logprob_chunk_rows`)."""
    n_rows = int(labels.numel())
    return gather_logprobs_entropy(
        logits,
        labels,
        temperature=temperature,
        chunk_size=logprob_chunk_rows(n_rows, int(logits.shape[-1])),
        compute_entropy=compute_entropy,
    )


def zero_through_model(model: torch.nn.Module, mb: Batch) -> torch.Tensor:
    """A float32 0-dim zero that depends on every parameter through one forward pass.

    For a micro-batch with no ``loss_mask`` token: its loss has no gradient, but a backward pass
    must still reach every parameter, so that every rank runs the same backward (DDP's
    gradient hooks) and the optimizer sees zero gradients rather than none. Runs the model on
    the row of ``mb`` with the most real tokens, keeping the logits of its last column only.
    """
    row = int(mb["attention_mask"].sum(-1).argmax())
    one = trim_columns({k: mb[k][row : row + 1] for k in ("input_ids", "attention_mask")})[0]
    attn = one["attention_mask"].long()
    out = model(
        input_ids=one["input_ids"],
        attention_mask=attn,
        position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
        logits_to_keep=1,
        use_cache=False,
    )
    return out.logits.float().sum() * 0.0


def forward_logprobs(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    compute_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs and entropies of the generated tokens of one micro-batch.

    Only the completion columns go through the LM head (``logits_to_keep``), and log-probs are
    gathered chunk by chunk (no full fp32 log-softmax over [b, t, vocab]).

    Returns ``(logprobs, entropy)``, both float32 ``[b, T]`` aligned to ``mb["input_ids"]``,
    zero outside the completion columns. ``entropy`` carries no gradient.
    """
    b, full_t = mb["input_ids"].shape
    trimmed, left, _right = trim_columns(mb)
    ids = trimmed["input_ids"]
    attn = trimmed["attention_mask"]
    t = ids.shape[1]
    start = completion_start(trimmed)
    logp_full = torch.zeros(b, full_t, dtype=torch.float32, device=ids.device)
    ent_full = torch.zeros(b, full_t, dtype=torch.float32, device=ids.device)
    if start >= t or start == 0:
        if torch.is_grad_enabled():
            logp_full = logp_full + zero_through_model(model, mb)
        return logp_full, ent_full
    position_ids = (attn.long().cumsum(-1) - 1).clamp(min=0)
    keep = t - start + 1  # hidden states at columns start-1 .. t-1
    out = model(
        input_ids=ids,
        attention_mask=attn.long(),
        position_ids=position_ids,
        logits_to_keep=keep,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # predicts the tokens at columns start .. t-1
    labels = ids[:, start:]
    logp, ent = token_logprobs(logits, labels, temperature, compute_entropy)
    cols = slice(left + start, left + t)
    logp_full[:, cols] = logp.float()
    if ent is not None:  # None exactly when not compute_entropy
        ent_full[:, cols] = ent.float()
    return logp_full, ent_full


def _supports_logits_to_keep_mask() -> bool:
    """transformers >= 5.2x slices hidden states with a boolean [b, t] ``logits_to_keep``."""
    try:
        from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401
    except ImportError:
        return False
    return True


_LOGITS_TO_KEEP_MASK = _supports_logits_to_keep_mask()


def forward_logprobs_packed(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    compute_entropy: bool = True,
    single_row: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`forward_logprobs` without padding: the sequences are packed into rows.

    Same contract as :func:`forward_logprobs` (float32 ``[b, T]`` aligned to
    ``mb["input_ids"]``), except that only the ``loss_mask`` positions are filled: every other
    entry is 0. Equal to the padded path at those positions up to float rounding (see
    ``tests/test_packing.py``). See :mod:`areal_m2po.engine.packing` for how the attention
    backends keep the packed sequences apart. ``single_row`` forces every sequence into one
    row (default: only for flash attention).
    """
    b, full_t = mb["input_ids"].shape
    device = mb["input_ids"].device
    flash = is_flash_attention(model)
    layout = pack_micro_batch(
        mb["input_ids"],
        mb["attention_mask"],
        mb["loss_mask"],
        single_row=flash if single_row is None else single_row,
    )
    logp_full = torch.zeros(b, full_t, dtype=torch.float32, device=device)
    ent_full = torch.zeros(b, full_t, dtype=torch.float32, device=device)
    if layout.labels.numel() == 0:
        if torch.is_grad_enabled():
            logp_full = logp_full + zero_through_model(model, mb)
        return logp_full, ent_full
    extra: dict[str, Any] = {}
    if flash:
        cu = layout.cu_seqlens.to(device)
        extra = {
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": layout.max_seqlen,
            "max_length_k": layout.max_seqlen,
        }
    keep = layout.logits_to_keep.to(device)
    out = model(
        input_ids=layout.input_ids.to(device),
        attention_mask=None,
        position_ids=layout.position_ids.to(device),
        logits_to_keep=keep if _LOGITS_TO_KEEP_MASK else 0,
        use_cache=False,
        **extra,
    )
    # [K, vocab]: the kept positions, row-major
    logits = out.logits if _LOGITS_TO_KEEP_MASK else out.logits[keep]
    logp, ent = token_logprobs(logits, layout.labels.to(device), temperature, compute_entropy)
    rows, cols = layout.dst_rows.to(device), layout.dst_cols.to(device)
    logp_full[rows, cols] = logp.float()
    if ent is not None:  # None exactly when not compute_entropy
        ent_full[rows, cols] = ent.float()
    return logp_full, ent_full
