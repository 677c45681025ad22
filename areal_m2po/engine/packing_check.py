"""The check that a packed forward equals the padded one on a given model, run once per engine
before the packed forward is trusted (``mb_spec.packing``)."""

from __future__ import annotations

import logging
import math

import torch

from areal_m2po.engine import fsdp
from areal_m2po.engine.forward import forward_logprobs, forward_logprobs_packed
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch

__all__ = ["packing_verdict"]

logger = logging.getLogger("areal_m2po.engine")


@torch.no_grad()
def packing_verdict(
    model: torch.nn.Module,
    mb: Batch,
    temperature: float,
    sharded: bool,
    device: torch.device,
    low_precision: bool,
) -> bool | None:
    """Compare packed and padded log-probs on a few sequences of the first micro-batch.

    The sequences go into one packed row, so a model that lets packed sequences see each
    other (a recurrent/SSM layer, a custom attention ignoring position ids) shows it. Returns
    None (check later) when the micro-batch has nothing to score. ``low_precision``: the
    model computes in bfloat16/float16 (a looser tolerance). ``sharded``: every rank calls it
    and the verdict is the same on all of them.
    """
    rows = torch.nonzero(mb["loss_mask"].any(-1)).flatten()[:4]
    if rows.numel() == 0 and not sharded:
        return None
    sub = {k: v.index_select(0, rows) for k, v in mb.items() if v.dim() >= 1}
    was_training = model.training
    model.eval()
    try:
        if rows.numel() == 0:  # sharded: two forwards in step with the other ranks
            diff = math.nan
            for _ in range(2):
                fsdp.idle_forward(model, device)
        else:
            padded, _ = forward_logprobs(model, sub, temperature, False)
            packed, _ = forward_logprobs_packed(model, sub, temperature, False, single_row=True)
            mask = sub["loss_mask"]
            diff = float((padded[mask] - packed[mask]).abs().max())
    finally:
        model.train(was_training)
    tol = 5e-2 if low_precision else 1e-3
    if sharded:  # one verdict for all ranks: 0 none yet, 1 packing ok, 2 not ok
        local = 0.0 if math.isnan(diff) else (1.0 if diff <= tol else 2.0)
        verdict = float(dist.all_reduce_max(torch.tensor([local]))[0])
        if verdict == 0.0:
            return None
        diff = diff if verdict == 1.0 or diff > tol else math.inf
    if diff > tol:
        logger.warning(
            "mb_spec.packing: packed log-probs differ from the padded ones by %.3g on this "
            "model (tolerance %.0e); using padded micro-batches",
            diff,
            tol,
        )
        return False
    logger.info("mb_spec.packing: packed forward checked (max |diff| %.2g)", diff)
    return True
