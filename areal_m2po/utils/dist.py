"""Thin helpers over ``torch.distributed`` (set up by Accelerate); no-ops in a single process."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def _comm_device(t: torch.Tensor) -> torch.device:
    """gloo reduces CPU tensors; nccl needs CUDA ones."""
    if is_distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(t: torch.Tensor, op: dist.ReduceOp.RedOpType) -> torch.Tensor:
    """``t`` reduced over ranks with ``op`` (a new tensor on ``t``'s device; ``t`` untouched)."""
    if not is_distributed():
        return t.clone()
    buf = t.detach().to(_comm_device(t), copy=True)
    dist.all_reduce(buf, op=op)
    return buf.to(t.device)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over ranks (a new tensor on ``t``'s device; ``t`` itself is untouched)."""
    return _all_reduce(t, dist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Element-wise max of ``t`` over ranks (a new tensor on ``t``'s device)."""
    return _all_reduce(t, dist.ReduceOp.MAX)


def all_gather_cat(t: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Concatenate the 1-D tensors of all ranks along dim 0, in rank order.

    Ranks may hold different lengths. Returns the concatenation and every rank's length, so a
    rank can find its own slice: ``sizes[:rank]`` summed is its offset.
    """
    if t.dim() != 1:
        raise ValueError(f"all_gather_cat expects a 1-D tensor, got shape {tuple(t.shape)}")
    if not is_distributed():
        return t, [t.numel()]
    dev = _comm_device(t)
    n = torch.tensor([t.numel()], dtype=torch.long, device=dev)
    sizes_t = [torch.zeros_like(n) for _ in range(world_size())]
    dist.all_gather(sizes_t, n)
    sizes = [int(s.item()) for s in sizes_t]
    longest = max(sizes)
    padded = torch.zeros(longest, dtype=t.dtype, device=dev)
    padded[: t.numel()] = t.detach().to(dev)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    out = torch.cat([p[:s] for p, s in zip(parts, sizes)]).to(t.device)
    return out, sizes


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (picklable objects; ``obj`` itself in one process)."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank ``dst``, None on the others."""
    if not is_distributed():
        return [obj]
    out: list[Any] | None = [None] * world_size() if rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


def exit_skipping_finalization(status: int = 0) -> NoReturn:
    """Flush stdout/stderr and end the process at once with ``status`` (``os._exit``).

    For a multi-process CPU worker whose results are written and whose ranks have synchronised:
    gloo's worker threads can still hold tensors when the interpreter finalises, and releasing
    them then aborts the process (SIGABRT, ``terminate called without an active exception``)
    even after ``destroy_process_group``. Skipping finalisation skips ``atexit`` handlers too,
    so close loggers and files first.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
