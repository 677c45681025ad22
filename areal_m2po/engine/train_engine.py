"""A Hugging Face causal LM trained through an ``accelerate.Accelerator``.

The engine owns the model, optimizer and LR scheduler. It knows nothing about PPO: the actor
hands it a batch, a micro-batch loss and a weight function, and the engine does micro-batching,
gradient accumulation with global token weighting, clipping and the optimizer step. Its forward
(:meth:`HFTrainEngine.forward_tokens`) gives per-token outputs: log-probs and entropies for a
policy, values for a critic (``forward_fn``).

What differs between placements (replicated: DDP; sharded: FSDP2) is the engine's placement
backend (:mod:`areal_m2po.engine.backends`, picked from ``backend`` in one place); a LoRA
adapter is an adapter on either (:class:`~areal_m2po.engine.lora.LoRAAdapter`); float16 mixed
precision is :class:`~areal_m2po.engine.precision.MixedPrecision`. The rollout side gets the
policy's weights from one method, :meth:`HFTrainEngine.weights_for_rollout`.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate import Accelerator

from areal_m2po.api.cli_args import RefConfig, TrainEngineConfig
from areal_m2po.engine import hf_model
from areal_m2po.engine.backends import PlacementBackend, backend_class
from areal_m2po.engine.builtin_models import resolve_model_path
from areal_m2po.engine.checked_forward import CheckedForwards
from areal_m2po.engine.dropout import disable_dropout
from areal_m2po.engine.forward import forward_logprobs
from areal_m2po.engine.lora import LoRAAdapter
from areal_m2po.engine.optim import restore_schedule
from areal_m2po.engine.precision import (
    TORCH_DTYPES,
    MixedPrecision,
    check_finite_weights,
    load_dtype,
)
from areal_m2po.engine.rollout_weights import RolloutWeights
from areal_m2po.engine.shared_prefix import HeadStore, forward_logprobs_shared_prefix
from areal_m2po.engine.step_stats import accumulate_stat, as_f64, global_step_stats
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch, select_rows, split_microbatches

__all__ = ["HFTrainEngine", "load_causal_lm"]

logger = logging.getLogger("areal_m2po.engine")

MicrobatchLoss = Callable[
    [torch.Tensor, torch.Tensor, Batch], tuple[torch.Tensor, dict[str, torch.Tensor]]
]
"""``microbatch_loss(outputs [b, t], aux [b, t], micro_batch) -> (loss, stats)``: the loss of
one micro-batch (``outputs``/``aux``: ``forward_fn``'s, e.g. log-probs and entropies) normalised
by that micro-batch's own weight (e.g. a token mean)."""
ForwardFn = Callable[[torch.nn.Module, Batch, float, bool], tuple[torch.Tensor, torch.Tensor]]
"""``forward_fn(model, micro_batch, temperature, compute_entropy) -> (per-token values [b, T],
auxiliary [b, T])``: log-probs and entropies for a policy, values and zeros for a critic. With
gradients enabled the values depend on the model's parameters through a forward pass even when
the micro-batch has nothing to score (see :func:`zero_through_model`)."""
WeightFn = Callable[[Batch], float]
"""``loss_weight_fn(micro_batch) -> weight`` (e.g. its number of valid tokens)."""

_TORCH_DTYPES = TORCH_DTYPES  # the name older imports use


def load_causal_lm(path: str, dtype: str, attn_implementation: str) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` on a local dir, hub id or ``builtin:`` path."""
    from transformers import AutoModelForCausalLM

    local = resolve_model_path(path)
    return AutoModelForCausalLM.from_pretrained(
        local, dtype=_TORCH_DTYPES[dtype], attn_implementation=attn_implementation
    )


def _with_graph(loss: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """``loss``, attached to the graph of the forward ``outputs`` when it has none of its own.

    A loss function may return a constant for a micro-batch with nothing to score; backward
    must still run through the model (see :func:`zero_through_model`), with zero gradient.
    """
    if loss.requires_grad or not torch.is_grad_enabled():
        return loss
    if not outputs.requires_grad:
        raise RuntimeError(
            "train_batch: neither the loss nor the forward_fn outputs depend on the model's "
            "parameters; forward_fn must run the model even on a micro-batch with nothing to score"
        )
    return loss + outputs.sum() * 0.0


class HFTrainEngine:
    """A trainable causal LM: per-token forward (``forward_tokens``), ``train_batch``,
    save/load, a version counter, and the policy's weights for the rollout side
    (:meth:`weights_for_rollout`).

    Args:
        config: the model/optimizer section (actor or critic).
        accelerator: the run's Accelerator (it owns devices and the process group).
        total_steps: optimizer steps the run will take (for the LR schedule).
        model: an already-built model instead of loading ``config.path`` (e.g. a critic).
        trainable: False for a frozen model (the reference policy): no optimizer.
        forward_fn: how a micro-batch becomes per-token outputs (default: log-probs).

    Where the model lives is the placement backend's (``config.backend``: ``ddp``
    replicates it through ``accelerator.prepare``; ``fsdp2`` shards it with FSDP2, the
    optimizer holding this rank's shards, every forward/backward a collective: ranks with
    fewer micro-batches, or with a micro-batch that has nothing to score, run idle forwards).
    """

    def __init__(
        self,
        config: TrainEngineConfig,
        accelerator: Accelerator,
        total_steps: int,
        model: torch.nn.Module | None = None,
        trainable: bool = True,
        forward_fn: ForwardFn | None = None,
    ) -> None:
        self.config = config
        self.accelerator = accelerator
        self.version = 0
        self.trainable = trainable
        backend = backend_class(config.backend)  # ddp or fsdp2, read here only
        self.precision = MixedPrecision(config.dtype, trainable, backend.sharded, self.device.type)
        self.backend: PlacementBackend = backend(config, accelerator, self.precision)
        lora_cfg = getattr(config, "lora", None)
        self.adapter = (
            LoRAAdapter(lora_cfg, config.gradient_checkpointing, config.dtype)
            if lora_cfg is not None and trainable
            else None
        )
        # the packed and shared-prefix forwards, each checked once on this model; only for the
        # policy's own log-probs (the default forward_fn)
        self.checks = CheckedForwards(
            config.mb_spec, self.sharded, self.device, self._low_precision, forward_fn is None
        )
        if forward_fn is None:
            forward_fn = self.checks.packed if config.mb_spec.packing else forward_logprobs
        self.forward_fn: ForwardFn = forward_fn
        if model is None:
            dtype = load_dtype(config.dtype, trainable, config.lora is not None)
            model = load_causal_lm(config.path, dtype, config.attn_implementation)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        if not trainable:
            model.requires_grad_(False)
            model.eval()
            self.model = self.backend.place(model)
            return
        if getattr(config, "disable_dropout", False):
            disable_dropout(model)
        if config.gradient_checkpointing:
            hf_model.as_pretrained(model).gradient_checkpointing_enable()
        if self.adapter is not None:  # only the adapters (and a head) require gradients
            model = self.adapter.wrap(model)
        self.precision.upcast_trainable(model)  # float16: float32 master weights
        self.model, self.optimizer, self.scheduler = self.backend.prepare(model, total_steps)

    @property
    def sharded(self) -> bool:
        """Whether the backend shards the model (fsdp2)."""
        return self.backend.sharded

    @property
    def lora(self) -> bool:
        """Whether the model trains a LoRA adapter (``config.lora``)."""
        return self.adapter is not None

    def _forward(
        self, mb: Batch, temperature: float, compute_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_fn`` on one micro-batch under the engine's precision; a sharded model is
        always called exactly once (an idle forward when ``forward_fn`` had nothing to score,
        tied to the output so that the backward runs the gradient reduce-scatter)."""

        def run() -> tuple[torch.Tensor, torch.Tensor]:
            with self.precision.autocast():
                return self.forward_fn(self.model, mb, temperature, compute_entropy)

        return self.backend.forward(self.model, run)

    # -- properties ---------------------------------------------------------------------------

    @property
    def unwrapped(self) -> torch.nn.Module:
        return self.backend.unwrap(self.model)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def current_lr(self) -> float:
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]["lr"])

    def computes_like_plain_model(self) -> bool:
        """Whether this engine's forward computes what a plain copy of its model in its
        ``dtype`` computes (the rollout side's): False with float16 mixed precision, where
        the engine runs float32 master weights under float16 autocast."""
        return not self.precision.enabled

    # -- forward ------------------------------------------------------------------------------

    def micro_batches(self, batch: Batch, group_size: int = 1) -> list[Batch]:
        """``batch`` cut as ``mb_spec`` says, groups of ``group_size`` consecutive rows kept
        together (:func:`split_microbatches`)."""
        spec = self.config.mb_spec
        idx = split_microbatches(batch, spec.n_mbs, spec.max_tokens_per_mb, group_size)
        return [{k: v.index_select(0, i.to(v.device)) for k, v in batch.items()} for i in idx]

    @torch.no_grad()
    def forward_tokens(
        self, batch: Batch, temperature: float, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_fn`` over the whole batch without gradient, micro-batch by micro-batch:
        ``(outputs, aux)``, float32 ``[B, T]``. A policy (the default ``forward_fn``) gives the
        log-probs of the batch's tokens at ``temperature`` and their entropies (zeros unless
        ``compute_entropy``); a critic gives its values and zeros."""
        self.model.eval()
        spec = self.config.mb_spec
        forward = self._forward
        shared = self.checks.shared_split(
            self.unwrapped, batch, temperature, spec.shared_prefix_max_tokens_per_mb, self.precision
        )
        if shared is not None:
            idx_list = shared  # a head of all a micro-batch's prompts: run once per pass
            forward = functools.partial(self._forward_shared_prefix, head_store=HeadStore())
        else:
            idx_list = split_microbatches(batch, spec.n_mbs, spec.max_tokens_per_mb)
        first = select_rows(batch, idx_list[0]) if idx_list else None
        self.checks.check_packing_on_all_ranks(self.model, first, batch, temperature)
        b, t = batch["input_ids"].shape
        home = batch["input_ids"].device  # the results stay where the batch is
        logp = torch.zeros(b, t, dtype=torch.float32, device=home)
        ent = torch.zeros(b, t, dtype=torch.float32, device=home)
        # agreed before any forward: a sharded forward is a collective, so a rank must not
        # reach the agreement while another runs its extra forwards
        n_idle = self.backend.idle_micro_batches(len(idx_list))
        for idx in idx_list:
            mb = {k: v.index_select(0, idx.to(v.device)).to(self.device) for k, v in batch.items()}
            mb_logp, mb_ent = forward(mb, temperature, compute_entropy)
            logp[idx.to(home)] = mb_logp.to(home)
            ent[idx.to(home)] = mb_ent.to(home)
        for _ in range(n_idle):
            self.backend.idle_forward(self.model)
        return logp, ent

    @torch.no_grad()
    def forward_whole(
        self, batch: Batch, temperature: float = 1.0, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_fn`` on the whole ``batch`` in one call (no micro-batches), without
        gradient, the model in eval mode, under the engine's precision, the inputs moved to
        the engine's device: an evaluation pass over a batch whose layout only ``forward_fn``
        knows (e.g. a reward model's pairs). Sharded: every rank calls it as often."""
        self.model.eval()
        mb = {k: v.to(self.device) for k, v in batch.items()}
        return self._forward(mb, temperature, compute_entropy)

    def _forward_shared_prefix(
        self, mb: Batch, temperature: float, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with self.precision.autocast():
            return forward_logprobs_shared_prefix(self.model, mb, temperature, *args, **kwargs)

    def _low_precision(self) -> bool:
        """Whether the model computes below float32 (the forward checks' looser tolerance)."""
        return (
            self.accelerator.mixed_precision != "no"
            or self.precision.enabled
            or self.config.fsdp.param_dtype not in (None, "float32")
            or any(p.dtype != torch.float32 for p in self.model.parameters())
        )

    # -- training -----------------------------------------------------------------------------

    def train_batch(
        self,
        batch: Batch,
        microbatch_loss: MicrobatchLoss,
        loss_weight_fn: WeightFn,
        temperature: float = 1.0,
        total_weight: float | None = None,
        group_size: int = 1,
    ) -> tuple[dict[str, float], dict[str, float]]:
        """One optimizer step over ``batch`` with gradient accumulation over micro-batches.

        Every ``group_size`` consecutive rows stay in one micro-batch (a loss over row groups,
        e.g. DPO's pairs: ``group_size=2``).

        Each micro-batch's loss is scaled by ``weight / total_weight`` where ``total_weight`` is
        the sum of ``loss_weight_fn`` over every micro-batch of every rank (or the value given,
        which must already be global). The summed gradient is therefore that of the loss over the
        whole global batch, whatever the split into micro-batches and ranks.

        A step whose total weight is zero (no ``loss_mask`` token on any rank) has nothing to
        learn from: every rank still runs its forward and (zero) backward passes, then no rank
        steps the optimizer or the LR scheduler, and ``train_stats["empty"]`` is 1.

        Returns ``(train_stats, loss_stats)``: grad norm, lr, whether the step was skipped for a
        non-finite loss or gradient on any rank, whether it was empty (a float16 model: the
        loss scale and whether the step overflowed it, see :mod:`areal_m2po.engine.precision`:
        no optimizer step, not counted as skipped); and the loss function's
        stats averaged with the micro-batch weights over all ranks (every rank must return the
        same stat keys).
        """
        assert self.optimizer is not None and self.scheduler is not None, "frozen engine"
        self.model.train()
        forward = self._forward
        shared = self.checks.train_split(
            self.unwrapped,
            batch,
            temperature,
            self.precision,
            group_size=group_size,
            checkpointing=self.config.gradient_checkpointing,
        )
        if shared is not None:
            forward = self._forward_shared_prefix
            mbs = [{k: v.index_select(0, i) for k, v in batch.items()} for i in shared]
        else:
            mbs = self.micro_batches(batch, group_size)
        self.checks.check_packing_on_all_ranks(
            self.model, mbs[0] if mbs else None, batch, temperature
        )
        weights = [float(loss_weight_fn(mb)) for mb in mbs]
        if total_weight is None:
            total_weight = float(
                dist.all_reduce_sum(torch.tensor(sum(weights), dtype=torch.float64))
            )
        self.optimizer.zero_grad(set_to_none=True)
        loss_total, stat_sums = self._accumulate_gradients(
            mbs, weights, total_weight, microbatch_loss, temperature, forward
        )
        self.precision.unscale_(self.model.parameters())
        clip = self.config.optimizer.gradient_clipping
        grad_norm = self.backend.clip_grad_norm(self.model, clip if clip > 0 else math.inf)
        grad_norm_f, loss_finite, loss_stats = global_step_stats(
            grad_norm, loss_total, stat_sums, sum(weights), self.device
        )
        scale = self.precision.scale
        overflow = self.precision.overflowed(loss_finite, math.isfinite(grad_norm_f))
        skipped = not (loss_finite and math.isfinite(grad_norm_f)) and not overflow
        empty = total_weight <= 0 and not skipped  # all global: the same on every rank
        self._optimizer_step(grad_norm_f, skipped, empty, overflow)
        train_stats = {
            "grad_norm": grad_norm_f,
            "lr": self.current_lr(),
            "skipped": float(skipped),
            "empty": float(empty),
            "n_micro_batches": float(len(mbs)),
        }
        if self.precision.enabled:
            train_stats.update(loss_scale=scale, overflow=float(overflow))
        return train_stats, loss_stats

    def _accumulate_gradients(
        self,
        mbs: list[Batch],
        weights: list[float],
        total_weight: float,
        microbatch_loss: MicrobatchLoss,
        temperature: float,
        forward: Callable[[Batch, float, bool], tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor | float, dict[str, torch.Tensor | float]]:
        """Forward and backward every micro-batch, each loss scaled by its share of the global
        ``total_weight`` (times the world size: the gradient reduce averages over ranks); the
        gradients are reduced over ranks with the last backward of this rank (sharded: idle
        backwards keep ranks holding fewer micro-batches in step).

        Returns this rank's weighted sums of the loss and of every loss stat, except that an
        extremum stat (``*_max`` / ``*_min``) keeps its extremum over the micro-batches with a
        positive weight (float64, left on the device: one host sync per step for all of them,
        not one per stat per micro-batch).
        """
        world = dist.world_size()
        stat_sums: dict[str, torch.Tensor | float] = {}
        loss_total: torch.Tensor | float = 0.0
        n_idle = self.backend.idle_micro_batches(len(mbs))
        for i, mb in enumerate(mbs):
            mb = {k: v.to(self.device) for k, v in mb.items()}
            last = i == len(mbs) - 1 and n_idle == 0
            with self.backend.grad_sync(self.model, last):
                logp, ent = forward(mb, temperature, True)
                loss, stats = microbatch_loss(logp, ent, mb)
                loss = _with_graph(loss, logp)
                scale = weights[i] / total_weight * world if total_weight > 0 else 0.0
                self.accelerator.backward(loss * (scale * self.precision.scale))
            loss_total = loss_total + as_f64(loss) * weights[i]
            for k, v in stats.items():
                stat_sums[k] = accumulate_stat(k, stat_sums.get(k), as_f64(v), weights[i])
        for j in range(n_idle):  # sharded: backwards in step with ranks holding more
            with self.backend.grad_sync(self.model, j == n_idle - 1):
                self.accelerator.backward(self.backend.idle_forward(self.model))
        return loss_total, stat_sums

    def _optimizer_step(self, grad_norm: float, skipped: bool, empty: bool, overflow: bool) -> None:
        """Step the optimizer and the LR scheduler, unless the step is ``skipped`` (non-finite
        loss or gradient), ``empty`` (no token with a loss weight) or an ``overflow`` of the
        float16 loss scale; clear the gradients."""
        assert self.optimizer is not None and self.scheduler is not None, "frozen engine"
        if overflow:
            logger.warning(
                "float16 gradient overflow: step skipped, loss scale lowered to %g",
                self.precision.scale,
            )
        elif skipped:
            logger.warning("non-finite loss or gradient (grad_norm=%s): step skipped", grad_norm)
        elif empty:
            logger.warning("no token with a loss weight on any rank: no optimizer step")
        else:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    # -- weights out --------------------------------------------------------------------------

    def weights_for_rollout(self) -> RolloutWeights:
        """The policy's weights as the rollout side takes them, at :attr:`version`
        (:class:`~areal_m2po.engine.rollout_weights.RolloutWeights`): full tensors under the
        plain model's names, and a plain model, the engine's own module only when no copy is
        needed (not sharded, no LoRA adapter, not float16 mixed precision). Building it is no
        collective; consuming its streams is, when sharded."""
        own = not (self.sharded or self.lora or self.precision.enabled)
        model = self.unwrapped
        return RolloutWeights(
            version=self.version,
            named_tensors=self.full_tensors,
            model=(lambda: model) if own else self.build_full_model,
            own_module=own,
            model_config=model.config,
            generation_config=getattr(model, "generation_config", None),
        )

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` of every model state entry, one at a time (for the rollout
        engine). Sharded: gathered one tensor at a time; a collective every rank must consume
        to the end. With LoRA: the merged weights under the base model's names."""
        stream = self.full_tensors_raw()
        if self.adapter is not None:  # the base model's names, W + s * B @ A layer by layer
            return self.adapter.merged(self.unwrapped, stream)
        return stream

    def full_tensors_raw(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`full_tensors` as the model names them (a LoRA model's adapters unmerged)."""
        return self.backend.full_tensors(self.model)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model state as the model names it, on the main process (the others may
        get an empty dict); a collective when sharded. What a trainer saving a model of its
        own kind (a reward model) writes."""
        return self.backend.full_state_on_main(self.model)

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) model weights on every rank (a collective when sharded)."""
        return dict(self.full_tensors())

    def build_full_model(self) -> torch.nn.Module:
        """An unsharded copy of the model on this rank's device, e.g. to seed the rollout
        engine (a collective when sharded: the weights are gathered tensor by tensor). With
        LoRA: a plain model holding the merged weights; float16 mixed precision: a float16
        copy of the float32 master weights."""
        if self.adapter is not None:
            return self.adapter.merged_model(self.unwrapped, self.full_tensors_raw(), self.device)
        dtype = TORCH_DTYPES[self.config.dtype] if self.precision.enabled else None
        return self.backend.plain_copy(self.model, dtype)

    # -- the base model of a LoRA engine ------------------------------------------------------

    @torch.no_grad()
    def forward_tokens_base(
        self, batch: Batch, temperature: float, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward_tokens` of the base model, the LoRA adapter disabled (the KL
        reference policy of a LoRA actor, without a second copy of the weights)."""
        assert self.adapter is not None, "forward_tokens_base needs a LoRA engine"
        with self.adapter.disabled(self.unwrapped):
            return self.forward_tokens(batch, temperature, compute_entropy)

    def adapter_base_reference(self) -> Any:
        """This LoRA engine's base model as a frozen reference policy
        (:class:`~areal_m2po.engine.lora_reference.LoRABaseReference`: no second copy of the
        weights); None without a LoRA adapter."""
        if self.adapter is None:
            return None
        from areal_m2po.engine.lora_reference import LoRABaseReference

        return LoRABaseReference(self)

    def lora_reference(self, ref: RefConfig, kl_ctl: float) -> Any:
        """The KL reference policy of a LoRA actor as its own base model
        (:meth:`adapter_base_reference`), when a KL term is on (``kl_ctl > 0``) and the
        reference is that model (``ref.path`` null or this model's path, same dtype); else
        None (a reference engine is loaded, or none is needed)."""
        same = ref.path in (None, self.config.path) and ref.dtype == self.config.dtype
        if not (same and kl_ctl > 0):
            return None
        return self.adapter_base_reference()

    # -- saves and recover checkpoints --------------------------------------------------------

    def save_hf(self, path: str, tokenizer: Any | None = None) -> None:
        """``save_pretrained`` (safetensors) of the model, plus the tokenizer; rank 0 writes
        (sharded: the full weights are gathered to rank 0's CPU first). With LoRA: the adapter,
        and the merged model in ``path/merged`` when ``lora.save_merged``. Weights holding NaN
        or infinity are never saved (:func:`check_finite_weights` raises first)."""
        check_finite_weights(self.model, path)
        state = self.full_state_dict()
        if self.accelerator.is_main_process and self.adapter is not None:
            self.adapter.save(self.unwrapped, path, state, tokenizer)
        elif self.accelerator.is_main_process:
            model = hf_model.as_pretrained(self.unwrapped)
            model.save_pretrained(path, state_dict=state, safe_serialization=True)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        self.accelerator.wait_for_everyone()

    def training_state(self, shard_dir: str | None = None) -> dict[str, Any]:
        """Model, optimizer and scheduler state for recover checkpoints.

        Sharded, the model and optimizer shards are written into ``shard_dir`` (every rank;
        nothing is gathered) and the returned dict holds ``"sharded": True`` instead of them.
        Weights holding NaN or infinity are refused (:func:`check_finite_weights`).
        """
        check_finite_weights(self.model, "a recover checkpoint")
        state: dict[str, Any] = {"version": self.version}
        if self.precision.enabled:
            state["loss_scale"] = self.precision.state_dict()
        self.backend.save_state(self.model, self.optimizer, shard_dir, state)
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_training_state(self, state: dict[str, Any], shard_dir: str | None = None) -> None:
        """Restore :meth:`training_state` (sharded: from ``shard_dir``, same world size)."""
        self.backend.check_state_backend(state)
        self.backend.load_state(self.model, self.optimizer, shard_dir, state)
        self.version = int(state["version"])
        self.precision.load_state_dict(state.get("loss_scale"))
        sched, opt = state.get("scheduler"), self.config.optimizer  # and this run's lr, betas
        restore_schedule(self.optimizer, self.scheduler, sched, opt)
