"""A Hugging Face causal LM trained through an ``accelerate.Accelerator``.

The engine owns the model, optimizer and LR scheduler. It knows nothing about PPO: the actor
hands it a batch, a micro-batch loss and a weight function, and the engine does micro-batching,
gradient accumulation with global token weighting, clipping and the optimizer step. Its forward
(:meth:`HFTrainEngine.forward_tokens`) gives per-token outputs: log-probs and entropies for a
policy, values for a critic (``forward_fn``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from accelerate import Accelerator

from areal_m2po.api.cli_args import RefConfig, TrainEngineConfig
from areal_m2po.engine import fsdp, hf_model, lora
from areal_m2po.engine.builtin_models import resolve_model_path
from areal_m2po.engine.checked_forward import CheckedForwards
from areal_m2po.engine.dropout import disable_dropout
from areal_m2po.engine.forward import forward_logprobs
from areal_m2po.engine.optim import build_optimizer, restore_schedule
from areal_m2po.engine.precision import MixedPrecision, check_finite_weights, load_dtype
from areal_m2po.engine.shared_prefix import HeadStore, forward_logprobs_shared_prefix
from areal_m2po.engine.step_stats import accumulate_stat, extremum, global_extrema
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

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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


def _as_f64(x: torch.Tensor | float) -> torch.Tensor:
    """A detached float64 0-dim CPU-or-device tensor (no host sync for device tensors)."""
    if isinstance(x, torch.Tensor):
        return x.detach().reshape(()).to(torch.float64)
    return torch.tensor(float(x), dtype=torch.float64)


class HFTrainEngine:
    """A trainable causal LM: per-token forward (``forward_tokens``), ``train_batch``,
    save/load, a version counter.

    Args:
        config: the model/optimizer section (actor or critic).
        accelerator: the run's Accelerator (it owns devices and the process group).
        total_steps: optimizer steps the run will take (for the LR schedule).
        model: an already-built model instead of loading ``config.path`` (e.g. a critic).
        trainable: False for a frozen model (the reference policy): no optimizer.
        forward_fn: how a micro-batch becomes per-token outputs (default: log-probs).

    With ``config.backend == "fsdp2"`` the model is sharded with :func:`fsdp.shard_model` on
    the process group Accelerate set up (it is not handed to ``accelerator.prepare``), the
    optimizer holds this rank's shards, and every forward/backward is a collective: ranks with
    fewer micro-batches, or with a micro-batch that has nothing to score, run idle forwards.
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
        self.sharded = config.backend == "fsdp2"
        # the packed and shared-prefix forwards, each checked once on this model; only for the
        # policy's own log-probs (the default forward_fn)
        self.checks = CheckedForwards(
            config.mb_spec, self.sharded, self.device, self._low_precision, forward_fn is None
        )
        if forward_fn is None:
            forward_fn = self.checks.packed if config.mb_spec.packing else forward_logprobs
        self.forward_fn: ForwardFn = forward_fn
        self._n_forward = 0  # calls of the model's forward (sharded: keeps ranks in step)
        self.precision = MixedPrecision(config.dtype, trainable, self.sharded, self.device.type)
        if model is None:
            dtype = load_dtype(config.dtype, trainable, config.lora is not None)
            model = load_causal_lm(config.path, dtype, config.attn_implementation)
        raw = model
        self.trainable = trainable
        if not trainable:
            raw.requires_grad_(False)
            raw.eval()
            self.model = self._place(raw)
            self.optimizer = None
            self.scheduler = None
            return
        if getattr(config, "disable_dropout", False):
            disable_dropout(raw)
        if config.gradient_checkpointing:
            hf_model.as_pretrained(raw).gradient_checkpointing_enable()
        if config.lora is not None:  # only the adapters (and a head) require gradients
            raw = self._with_lora(raw)
        self.precision.upcast_trainable(raw)  # float16: float32 master weights
        if self.sharded:
            raw = self._place(raw)
        optimizer, scheduler = build_optimizer(raw.parameters(), config.optimizer, total_steps)
        # The scheduler stays unwrapped: Accelerate's wrapper steps it once per process.
        if self.sharded:
            self.model, self.optimizer = raw, optimizer
        else:
            self.model, self.optimizer = accelerator.prepare(raw, optimizer)
        self.scheduler = scheduler

    def _with_lora(self, raw: torch.nn.Module) -> torch.nn.Module:
        """``raw`` wrapped with the LoRA adapter of ``config.lora`` (:mod:`engine.lora`)."""
        assert self.config.lora is not None
        model = lora.apply_lora(raw, self.config.lora)
        if self.config.gradient_checkpointing:  # frozen embeddings: checkpoints need an input grad
            hf_model.as_pretrained(model).enable_input_require_grads()
        return model

    @property
    def lora(self) -> bool:
        """Whether the model trains a LoRA adapter (``config.lora``)."""
        return getattr(self.config, "lora", None) is not None and self.trainable

    def _place(self, raw: torch.nn.Module) -> torch.nn.Module:
        """The model on this process's device; sharded over all processes with fsdp2."""
        if not self.sharded:
            return raw.to(self.accelerator.device)
        fsdp_cfg = self.config.fsdp
        if self.precision.enabled and fsdp_cfg.param_dtype is None:  # compute in float16
            fsdp_cfg = dataclasses.replace(fsdp_cfg, param_dtype="float16")
        model = fsdp.shard_model(raw, fsdp_cfg, self.accelerator.device)

        def count(*_: Any) -> None:
            self._n_forward += 1

        model.register_forward_pre_hook(count)
        return model

    def _idle_micro_batches(self, n_local: int) -> int:
        """Idle forwards this rank adds so that every rank runs as many forwards (fsdp2)."""
        if not self.sharded:
            return 0
        most = int(dist.all_reduce_max(torch.tensor([float(n_local)]))[0])
        return most - n_local

    def _forward(
        self, mb: Batch, temperature: float, compute_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward_fn`` on one micro-batch; a sharded model is always called exactly once
        (an idle forward when ``forward_fn`` had nothing to score), tying the zero output to
        the graph so the backward runs the gradient reduce-scatter with the other ranks."""
        before = self._n_forward
        with self.precision.autocast():
            out, aux = self.forward_fn(self.model, mb, temperature, compute_entropy)
        if self.sharded and self._n_forward == before:
            out = out + fsdp.idle_forward(self.model, self.device)
        return out, aux

    def _grad_sync(self, enabled: bool) -> Any:
        """A context in which the backward reduces gradients over ranks only if ``enabled``."""
        if not self.sharded:
            return contextlib.nullcontext() if enabled else self.accelerator.no_sync(self.model)
        fsdp.set_grad_sync(self.model, enabled or not self.config.fsdp.accumulate_unsharded_grads)
        return contextlib.nullcontext()

    def _clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        if self.sharded:
            return fsdp.clip_grad_norm(list(self.model.parameters()), max_norm)
        return self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)

    # -- properties ---------------------------------------------------------------------------

    @property
    def unwrapped(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    def current_lr(self) -> float:
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]["lr"])

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
        n_idle = self._idle_micro_batches(len(idx_list))
        for idx in idx_list:
            mb = {k: v.index_select(0, idx.to(v.device)).to(self.device) for k, v in batch.items()}
            mb_logp, mb_ent = forward(mb, temperature, compute_entropy)
            logp[idx.to(home)] = mb_logp.to(home)
            ent[idx.to(home)] = mb_ent.to(home)
        for _ in range(n_idle):
            fsdp.idle_forward(self.model, self.device)
        return logp, ent

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
        grad_norm = self._clip_grad_norm(clip if clip > 0 else math.inf)
        grad_norm_f, loss_finite, loss_stats = self._global_step_stats(
            grad_norm, loss_total, stat_sums, sum(weights)
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
        n_idle = self._idle_micro_batches(len(mbs))
        for i, mb in enumerate(mbs):
            mb = {k: v.to(self.device) for k, v in mb.items()}
            last = i == len(mbs) - 1 and n_idle == 0
            with self._grad_sync(last):
                logp, ent = forward(mb, temperature, True)
                loss, stats = microbatch_loss(logp, ent, mb)
                loss = _with_graph(loss, logp)
                scale = weights[i] / total_weight * world if total_weight > 0 else 0.0
                self.accelerator.backward(loss * (scale * self.precision.scale))
            loss_total = loss_total + _as_f64(loss) * weights[i]
            for k, v in stats.items():
                stat_sums[k] = accumulate_stat(k, stat_sums.get(k), _as_f64(v), weights[i])
        for j in range(n_idle):  # sharded: backwards in step with ranks holding more
            with self._grad_sync(j == n_idle - 1):
                self.accelerator.backward(fsdp.idle_forward(self.model, self.device))
        return loss_total, stat_sums

    def _global_step_stats(
        self,
        grad_norm: torch.Tensor,
        loss_total: torch.Tensor | float,
        stat_sums: dict[str, torch.Tensor | float],
        stat_weight: float,
    ) -> tuple[float, bool, dict[str, float]]:
        """The step's grad norm, whether every rank's loss is finite and its loss stats, the
        same on every rank.

        One host sync for this rank's values, then one all-reduce; each loss stat is its
        weighted sum over all ranks divided by the total weight (``stat_weight`` summed over
        ranks; 1 when zero).
        """
        keys = sorted(k for k in stat_sums if extremum(k) is None)
        ext_keys = sorted(k for k in stat_sums if extremum(k) is not None)
        values = [grad_norm, loss_total] + [stat_sums[k] for k in keys + ext_keys]
        host = torch.stack([_as_f64(v).to(self.device) for v in values]).tolist()
        grad_norm_f, loss_total_f = host[0], host[1]
        sums = dist.all_reduce_sum(
            torch.tensor(
                host[2 : 2 + len(keys)]
                + [stat_weight, 0.0 if math.isfinite(loss_total_f) else 1.0],
                dtype=torch.float64,
            )
        ).tolist()
        denom = sums[-2] if sums[-2] > 0 else 1.0
        loss_stats = {k: v / denom for k, v in zip(keys, sums)}
        loss_stats.update(global_extrema(ext_keys, host[2 + len(keys) :]))
        return grad_norm_f, sums[-1] == 0, loss_stats

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

    # -- state --------------------------------------------------------------------------------

    def full_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` of every model state entry, one at a time (for the rollout
        engine). Sharded: gathered one tensor at a time; a collective every rank must consume
        to the end. With LoRA: the merged weights under the base model's names."""
        stream = self.full_tensors_raw()
        if self.lora:  # the base model's names, W + s * B @ A layer by layer
            return lora.merged_named_tensors(stream, lora.lora_scalings(self.unwrapped))
        return stream

    def full_tensors_raw(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`full_tensors` as the model names them (a LoRA model's adapters unmerged)."""
        if self.sharded:
            return fsdp.iter_full_tensors(self.model)
        return iter(self.unwrapped.state_dict().items())

    @torch.no_grad()
    def forward_tokens_base(
        self, batch: Batch, temperature: float, compute_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward_tokens` of the base model, the LoRA adapter disabled (the KL
        reference policy of a LoRA actor, without a second copy of the weights)."""
        assert self.lora, "forward_tokens_base needs a LoRA engine"
        with lora.adapter_disabled(self.unwrapped):
            return self.forward_tokens(batch, temperature, compute_entropy)

    def lora_reference(self, ref: RefConfig, kl_ctl: float) -> Any:
        """The KL reference policy of a LoRA actor as its own base model, adapter disabled
        (:class:`~areal_m2po.engine.lora_reference.LoRABaseReference`: no second copy of the
        weights), when a KL term is on (``kl_ctl > 0``) and the reference is that model
        (``ref.path`` null or this model's path, same dtype); else None (a reference engine
        is loaded, or none is needed)."""
        same = ref.path in (None, self.config.path) and ref.dtype == self.config.dtype
        if not (self.lora and same and kl_ctl > 0):
            return None
        from areal_m2po.engine.lora_reference import LoRABaseReference

        return LoRABaseReference(self)

    def state_dict_for_sync(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) model weights on every rank (a collective when sharded)."""
        return dict(self.full_tensors())

    def build_full_model(self) -> torch.nn.Module:
        """An unsharded copy of the model on this rank's device, e.g. to seed the rollout
        engine (a collective when sharded: the weights are gathered tensor by tensor)."""
        if self.lora:  # a plain model holding the merged weights
            dtype = _TORCH_DTYPES[self.config.dtype]
            return lora.merged_model_from(
                self.unwrapped, self.full_tensors_raw(), self.device, dtype
            )
        if not self.sharded:  # float16: a float16 copy of the float32 master weights
            copy_dtype = _TORCH_DTYPES[self.config.dtype] if self.precision.enabled else None
            return copy.deepcopy(self.unwrapped).to(dtype=copy_dtype)
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(
            self.unwrapped.config, dtype=_TORCH_DTYPES[self.config.dtype]
        ).to(self.device)
        own = model.state_dict()
        with torch.no_grad():
            for name, value in self.full_tensors():
                if name in own:
                    own[name].copy_(value)
        return model

    def save_hf(self, path: str, tokenizer: Any | None = None) -> None:
        """``save_pretrained`` (safetensors) of the model, plus the tokenizer; rank 0 writes
        (sharded: the full weights are gathered to rank 0's CPU first). With LoRA: the adapter,
        and the merged model in ``path/merged`` when ``lora.save_merged``. Weights holding NaN
        or infinity are never saved (:func:`check_finite_weights` raises first)."""
        check_finite_weights(self.model, path)
        if self.sharded:
            state = fsdp.full_state_dict_on_rank0(self.model)
        else:
            state = self.accelerator.get_state_dict(self.model)
        if self.accelerator.is_main_process and self.lora:
            assert self.config.lora is not None
            save_merged = self.config.lora.save_merged
            lora.save_lora_pretrained(self.unwrapped, path, state, save_merged, tokenizer)
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
        if self.sharded:
            if shard_dir is None:
                raise ValueError("a sharded engine writes its training state to a shard_dir")
            fsdp.save_sharded(self.model, self.optimizer, shard_dir)
            state["sharded"] = True
        else:
            state["model"] = self.accelerator.get_state_dict(self.model)
            if self.optimizer is not None:
                state["optimizer"] = self.optimizer.state_dict()
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_training_state(self, state: dict[str, Any], shard_dir: str | None = None) -> None:
        """Restore :meth:`training_state` (sharded: from ``shard_dir``, same world size)."""
        if bool(state.get("sharded", False)) != self.sharded:
            raise ValueError(
                "written with backend "
                + ("fsdp2" if state.get("sharded") else "ddp")
                + f" but this run uses backend {self.config.backend}"
            )
        if self.sharded:
            if shard_dir is None:
                raise ValueError("a sharded engine loads its training state from a shard_dir")
            fsdp.load_sharded(self.model, self.optimizer, shard_dir)
        else:
            self.unwrapped.load_state_dict(state["model"])
            if self.optimizer is not None and "optimizer" in state:
                self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.precision.load_state_dict(state.get("loss_scale"))
        sched, opt = state.get("scheduler"), self.config.optimizer  # and this run's lr, betas
        restore_schedule(self.optimizer, self.scheduler, sched, opt)
