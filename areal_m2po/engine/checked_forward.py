"""The policy forwards that are trusted only once seen to equal the plain one on the model at
hand: packed micro-batches (:mod:`~areal_m2po.engine.packing_check`) and shared prompts
(:mod:`~areal_m2po.engine.shared_prefix`). One :class:`CheckedForwards` per train engine holds
the two verdicts, each taken once."""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch

from areal_m2po.api.cli_args import MicroBatchSpec
from areal_m2po.engine.forward import forward_logprobs, forward_logprobs_packed
from areal_m2po.engine.packing_check import packing_verdict
from areal_m2po.engine.shared_prefix import shared_prefix_split, shared_prefix_verdict
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch

__all__ = ["CheckedForwards"]

logger = logging.getLogger("areal_m2po.engine")


class Autocasts(Protocol):
    """What gives the model's autocast context (:class:`~areal_m2po.engine.precision.MixedPrecision`)."""

    def autocast(self) -> AbstractContextManager[Any]: ...


class CheckedForwards:
    """The packing and shared-prefix verdicts of one engine's model.

    Args:
        spec: the engine's micro-batch settings (``packing``, ``shared_prefix``).
        sharded: the model is sharded (fsdp2): every forward is a collective, so the packing
            check runs on all ranks at once (:meth:`check_packing_on_all_ranks`) and prompts
            are never shared (a shared pass calls the model twice per micro-batch).
        device: where the model's inputs go.
        low_precision: whether the model computes below float32 (a looser tolerance).
        scores_policy: the engine's forward gives the policy's own log-probs (not a critic's
            values): only then may prompts be shared.
    """

    def __init__(
        self,
        spec: MicroBatchSpec,
        sharded: bool,
        device: torch.device,
        low_precision: Callable[[], bool],
        scores_policy: bool,
    ) -> None:
        self.spec = spec
        self.sharded = sharded
        self.device = device
        self.low_precision = low_precision
        self.scores_policy = scores_policy
        self.packing_ok: bool | None = None  # packed == padded on this model (None: not yet)
        self.shared_prefix_ok: bool | None = None  # shared == plain (None: not yet)
        self.train_fallback_said = False  # the plain-split fallback of training was logged

    def packed(
        self, model: torch.nn.Module, mb: Batch, temperature: float, compute_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed forward once it has been seen to equal the padded one on this model,
        the padded one before (sharded: until :meth:`check_packing_on_all_ranks`) or after a
        failed check."""
        if self.packing_ok is None and not self.sharded:
            self.packing_ok = packing_verdict(
                model, mb, temperature, False, self.device, self.low_precision()
            )
        if not self.packing_ok:
            return forward_logprobs(model, mb, temperature, compute_entropy)
        return forward_logprobs_packed(model, mb, temperature, compute_entropy)

    def check_packing_on_all_ranks(
        self, model: torch.nn.Module, first_mb: Batch | None, batch: Batch, temperature: float
    ) -> None:
        """Sharded, packing on, the policy's log-probs (not a critic's values), not yet decided:
        the one-time packing check, called by every rank before a pass's first forward (it
        runs forwards and an all-reduce, collectives all ranks must reach in the same order),
        with this rank's first micro-batch, or its empty ``batch`` when it holds none. A rank
        without a micro-batch used to skip it, and the others waited in it forever."""
        if not (self.sharded and self.spec.packing and self.scores_policy):
            return
        if self.packing_ok is not None:
            return
        mb = first_mb if first_mb is not None else batch
        mb = {k: v.to(self.device) for k, v in mb.items()}
        self.packing_ok = packing_verdict(
            model, mb, temperature, True, self.device, self.low_precision()
        )

    def shared_split(
        self,
        model: torch.nn.Module,
        batch: Batch,
        temperature: float,
        budget: int | None,
        precision: Autocasts,
    ) -> list[torch.Tensor] | None:
        """The micro-batches (row indices, prompt groups within ``budget`` tokens) of a
        shared-prefix pass over ``batch``, or None where it does not apply: ``shared_prefix``
        off, not the policy's log-probs, a sharded model, no prompt shared by two rows, fewer
        groups than ``n_mbs``, or a model on which it was seen to differ from the plain pass
        (checked on the first batch that shares a prompt, under ``precision.autocast()``, on
        the unwrapped ``model``)."""
        if not (self.spec.shared_prefix and self.scores_policy) or self.sharded:
            return None
        if self.shared_prefix_ok is False:
            return None
        idx = shared_prefix_split(batch, budget)
        if idx is None or len(idx) < self.spec.n_mbs:
            return None
        if self.shared_prefix_ok is None:
            sample = {k: v.to(self.device) for k, v in batch.items()}
            with precision.autocast():
                self.shared_prefix_ok = shared_prefix_verdict(
                    model, sample, temperature, self.low_precision()
                )
        return idx if self.shared_prefix_ok else None

    def train_split(
        self,
        model: torch.nn.Module,
        batch: Batch,
        temperature: float,
        precision: Autocasts,
        *,
        group_size: int = 1,
        checkpointing: bool = False,
    ) -> list[torch.Tensor] | None:
        """:meth:`shared_split` for a training pass (``shared_prefix_train``, within
        ``max_tokens_per_mb``), or None for the plain split. With ``shared_prefix_train`` on
        (and ``shared_prefix``, for the policy's log-probs), the plain split is also taken, and
        said once in the log, with several processes (DDP
        expects one forward per backward), gradient checkpointing (``checkpointing``: no KV
        cache in training) or a loss over row groups (``group_size`` > 1)."""
        if not (self.spec.shared_prefix and self.spec.shared_prefix_train and self.scores_policy):
            return None
        reason = self._train_fallback(group_size, checkpointing)
        if reason is not None:
            if not self.train_fallback_said:
                logger.info("mb_spec.shared_prefix_train: the plain split instead (%s)", reason)
                self.train_fallback_said = True
            return None
        return self.shared_split(model, batch, temperature, self.spec.max_tokens_per_mb, precision)

    def _train_fallback(self, group_size: int, checkpointing: bool) -> str | None:
        """Why a training pass cannot share prompts here (None: it may)."""
        if dist.is_distributed():
            return "several processes: DDP expects one forward per backward"
        if checkpointing:
            return "gradient checkpointing: no KV cache in training"
        if group_size != 1:
            return f"rows are kept in groups of {group_size}"
        return None
