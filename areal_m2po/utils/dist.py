"""Thin helpers over ``torch.distributed`` (set up by Accelerate; no-ops in a single process),
its clean shutdown, and the ``accelerate launch`` command of a multi-process CPU run."""

from __future__ import annotations

import atexit
import gc
import logging
import os
import sys
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from areal_m2po.utils.net import free_port


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


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` in rank order, on every rank (``[obj]`` in one process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_object(obj: Any, dst: int = 0) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank ``dst``, None on the others."""
    if not is_distributed():
        return [obj]
    out: list[Any] | None = [None] * world_size() if rank() == dst else None
    dist.gather_object(obj, out, dst=dst)
    return out


GLOO_WORKER_THREAD = "pt_gloo_runloop"
"""The name (``/proc/<pid>/task/*/comm``) torch gives the worker threads of a gloo process group."""


def gloo_worker_threads() -> int:
    """How many gloo worker threads this process runs now (Linux; 0 where ``/proc`` is absent).

    They belong to a C++ ``ProcessGroupGloo`` and end only when that object is destroyed, which
    :func:`end_process_group` does not guarantee: anything still holding the process group (a
    DDP reducer, a device mesh) keeps them alive until the interpreter finalises.
    """
    tasks = f"/proc/{os.getpid()}/task"
    if not os.path.isdir(tasks):
        return 0
    n = 0
    for tid in os.listdir(tasks):
        try:
            with open(os.path.join(tasks, tid, "comm"), encoding="utf-8") as f:
                n += f.read().strip() == GLOO_WORKER_THREAD
        except OSError:  # the thread ended meanwhile
            continue
    return n


def end_process_group() -> bool:
    """Leave the default process group in order: a barrier (every rank has finished every
    collective), a garbage collection (reference cycles holding collective handles or tensors
    given to a collective are freed now, on this thread), then ``destroy_process_group``.

    Returns True when a process group was destroyed, False when none was initialised.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if dist.get_world_size() > 1:
        dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    gc.collect()
    return True


def exit_status_after_run(status: int) -> int:
    """The exit status of an entry point, ending the process here if gloo threads outlive it.

    A multi-process CPU run's gloo worker threads can outlive ``destroy_process_group`` (see
    :func:`gloo_worker_threads`). If the interpreter then finalises, a worker thread that drops
    the last reference to a tensor with a Python object must take the GIL; a finalising Python
    ends such a thread with ``pthread_exit``, whose unwinding through a ``noexcept`` C++ frame
    calls ``std::terminate`` ("terminate called without an active exception"): SIGABRT after
    the run's work is done, at random. So when such threads are alive and the process group is
    gone (the run closed it), the ``atexit`` handlers run (they flush the logs, stop launched
    servers) and the process ends with ``status`` without finalising the interpreter
    (:func:`exit_skipping_finalization`); otherwise ``status`` is returned for a normal exit.
    """
    if dist.is_available() and dist.is_initialized():
        return status  # still in use: the caller's to close
    if gloo_worker_threads() == 0:
        return status
    atexit._run_exitfuncs()  # what a normal exit runs before finalising (logging.shutdown, ...)
    logging.shutdown()
    exit_skipping_finalization(status)


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


def cpu_launch_command(num_processes: int, port: int | None = None) -> list[str]:
    """The argv prefix of ``accelerate launch`` for ``num_processes`` processes on this machine
    with gloo (``--multi_gpu`` is what starts N processes even without GPUs; ``--cpu`` alone
    starts one), no mixed precision, no dynamo, on a free ``port`` (None: pick one). Append the
    script and its arguments."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port() if port is None else port),
    ]
