"""Reward-model training: a Bradley-Terry reward model learned from preference pairs.

One step takes ``train_dataset.batch_size`` pairs (split across ranks), scores each chosen and
rejected text with the model (:func:`areal_m2po.reward.reward_model.forward_scores`: the
``score`` head at the last real token), and takes one AdamW step on
:func:`areal_m2po.algo.bradley_terry.bradley_terry_loss` averaged over the global batch.
Metrics (TRL's names under ``train/`` and ``eval/``: ``loss``, ``accuracy``, ``margin``,
``mean_reward``, ``min_reward``, ``max_reward``) go to ``metrics.jsonl``; the model is saved in
Hugging Face format (``AutoModelForSequenceClassification.from_pretrained``-loadable, tokenizer
alongside) to ``<output_dir>/checkpoints/final``.

Data, tokenizer and every pair's length are checked before the model loads.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from typing import Any

import torch

from areal_m2po.algo.bradley_terry import bradley_terry_loss, preference_stats
from areal_m2po.api.cli_args import PreferenceDatasetConfig, RWConfig
from areal_m2po.trainer.launch import check_batch_split
from areal_m2po.trainer.run_setup import (
    EXIT_BAD_INPUT,
    build_or_report,
    make_stats_logger,
    start_run,
    write_run_config,
)
from areal_m2po.trainer.step_loop import StepLoop, epoch_loader
from areal_m2po.utils import dist

logger = logging.getLogger("areal_m2po.rw_trainer")

__all__ = ["RWTrainer", "run"]


def _load_pairs(
    dcfg: PreferenceDatasetConfig, tokenizer: Any, max_length: int
) -> list[dict[str, Any]]:
    from areal_m2po.dataset.preference import load_preference_records, tokenize_preference_pairs

    assert dcfg.path is not None
    records = load_preference_records(dcfg.path, dcfg.split, dcfg.max_samples)
    return tokenize_preference_pairs(records, tokenizer, max_length, dcfg.use_chat_template)


class RWTrainer(StepLoop):
    """Builds data, model and optimizer from an :class:`RWConfig` and runs the step loop (its
    bookkeeping: :class:`~areal_m2po.trainer.step_loop.StepLoop`; no recover checkpoints)."""

    def __init__(self, config: RWConfig) -> None:
        self.config = cfg = config
        cfg.check_required()
        ctx = start_run(cfg)
        self.accelerator, self.is_main = ctx.accelerator, ctx.is_main
        self.rank, self.world, self.output_dir = ctx.rank, ctx.world, ctx.output_dir
        self._build_data()
        write_run_config(cfg, ctx)
        self._build_model()
        self.stats_logger = make_stats_logger(cfg, ctx)
        self.step = 0

    def _build_data(self) -> None:
        from areal_m2po.reward.reward_model import load_reward_tokenizer

        cfg = self.config
        self.tokenizer = load_reward_tokenizer(cfg.tokenizer_path or cfg.model.path)
        self.train_pairs = _load_pairs(cfg.train_dataset, self.tokenizer, cfg.max_length)
        self.valid_pairs = (
            _load_pairs(cfg.valid_dataset, self.tokenizer, cfg.max_length)
            if cfg.valid_dataset is not None
            else []
        )
        check_batch_split(cfg.train_dataset.batch_size, self.world)
        self.loader, self.total_steps = epoch_loader(self.train_pairs, cfg)

    def _build_model(self) -> None:
        from areal_m2po.engine.optim import build_optimizer
        from areal_m2po.reward.reward_model import LastTokenScorer, load_reward_model

        mcfg = self.config.model
        model = load_reward_model(
            mcfg.path, mcfg.dtype, mcfg.attn_implementation, self.tokenizer.pad_token_id
        )
        if mcfg.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if mcfg.lora is not None:  # adapters and the score head train; the body stays frozen
            from areal_m2po.engine.lora import apply_lora

            model = apply_lora(model, mcfg.lora)
            if mcfg.gradient_checkpointing:
                model.enable_input_require_grads()
        optimizer, self.scheduler = build_optimizer(
            model.parameters(), mcfg.optimizer, self.total_steps
        )
        self.scorer, self.optimizer = self.accelerator.prepare(LastTokenScorer(model), optimizer)

    @property
    def model(self) -> torch.nn.Module:
        """The (unwrapped) sequence-classification model."""
        return self.accelerator.unwrap_model(self.scorer).model  # type: ignore[no-any-return]

    # -- scoring ------------------------------------------------------------------------------

    def _pair_scores(self, pairs: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) rewards ``[P]`` of ``pairs`` in one forward (right padding)."""
        from areal_m2po.reward.reward_model import pad_sequences

        seqs = [p["chosen_ids"] for p in pairs] + [p["rejected_ids"] for p in pairs]
        ids, mask = pad_sequences(seqs, self.tokenizer.pad_token_id, "right")
        device = self.accelerator.device
        scores = self.scorer(ids.to(device), mask.to(device))
        return scores[: len(pairs)], scores[len(pairs) :]

    def _margins(self, pairs: list[dict[str, Any]]) -> torch.Tensor | None:
        if not any("margin" in p for p in pairs):
            return None
        return torch.tensor([p.get("margin", 0.0) for p in pairs], device=self.accelerator.device)

    def _gathered_stats(
        self, chosen: list[torch.Tensor], rejected: list[torch.Tensor], prefix: str
    ) -> dict[str, float]:
        """TRL's metrics over the rewards of every rank, with the loss recomputed on them."""
        c, _ = dist.all_gather_cat(torch.cat(chosen).detach().float().cpu())
        r, _ = dist.all_gather_cat(torch.cat(rejected).detach().float().cpu())
        stats = {f"{prefix}/{k}": float(v) for k, v in preference_stats(c, r).items()}
        stats[f"{prefix}/n_pairs"] = float(c.numel())
        return stats

    # -- training -----------------------------------------------------------------------------

    def _local_rows(self, items: list[Any]) -> list[Any]:
        per = len(items) // self.world
        return items[self.rank * per : (self.rank + 1) * per]

    def train_step(self, pairs: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step on this rank's ``pairs`` (the global batch's mean loss)."""
        cfg = self.config
        n_global = len(pairs) * self.world
        mb = cfg.model.micro_batch_size or len(pairs)
        coef = cfg.center_rewards_coefficient or 0.0
        self.scorer.train()
        self.optimizer.zero_grad(set_to_none=True)
        chosen_all, rejected_all = [], []
        loss_sum = torch.zeros((), dtype=torch.float64)
        chunks = [pairs[i : i + mb] for i in range(0, len(pairs), mb)]
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            ctx = contextlib.nullcontext() if last else self.accelerator.no_sync(self.scorer)
            with ctx:
                chosen, rejected = self._pair_scores(chunk)
                loss = bradley_terry_loss(chosen, rejected, self._margins(chunk), coef)
                # DDP averages gradients over ranks: scale so the sum is the global mean
                self.accelerator.backward(loss * (len(chunk) / n_global) * self.world)
            loss_sum += loss.detach().double().cpu() * len(chunk)
            chosen_all.append(chosen)
            rejected_all.append(rejected)
        clip = cfg.model.optimizer.gradient_clipping
        grad_norm = float(
            self.accelerator.clip_grad_norm_(
                self.scorer.parameters(), clip if clip > 0 else math.inf
            )
        )
        loss_total = float(dist.all_reduce_sum(loss_sum.reshape(1))[0]) / n_global
        if math.isfinite(grad_norm) and math.isfinite(loss_total):
            self.optimizer.step()
            self.scheduler.step()
        else:
            logger.warning("non-finite loss or gradient (grad_norm=%s): step skipped", grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        stats = self._gathered_stats(chosen_all, rejected_all, "train")
        stats.update(
            {
                "train/loss": loss_total,
                "train/grad_norm": grad_norm,
                "train/lr": float(self.optimizer.param_groups[0]["lr"]),
            }
        )
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss and TRL's metrics on the held-out pairs (each rank scores a strided share)."""
        if not self.valid_pairs:
            return {}
        t0 = time.perf_counter()
        mine = self.valid_pairs[self.rank :: self.world]
        bs = self.config.valid_dataset.batch_size if self.config.valid_dataset else 16
        self.scorer.eval()
        chosen_all, rejected_all = [torch.zeros(0)], [torch.zeros(0)]
        for i in range(0, len(mine), bs):
            chosen, rejected = self._pair_scores(mine[i : i + bs])
            chosen_all.append(chosen.cpu())
            rejected_all.append(rejected.cpu())
        stats = self._gathered_stats(chosen_all, rejected_all, "eval")
        c, _ = dist.all_gather_cat(torch.cat(chosen_all).float())
        r, _ = dist.all_gather_cat(torch.cat(rejected_all).float())
        # the held-out loss without margins or centring: the pure Bradley-Terry NLL
        stats["eval/loss"] = float(bradley_terry_loss(c, r))
        stats["timing/eval_s"] = time.perf_counter() - t0
        return stats

    def save_hf(self, tag: str) -> str:
        """``save_pretrained`` of the reward model and its tokenizer; rank 0 writes. With
        ``model.lora``: the adapter and score head, and with ``lora.save_merged`` the merged
        model in ``<path>/merged`` (what ``reward.model.path`` of PPO loads)."""
        path = os.path.join(self.output_dir, "checkpoints", tag)
        state = self.accelerator.get_state_dict(self.scorer)
        lora_cfg = self.config.model.lora
        if self.is_main:
            inner = {k.removeprefix("model."): v for k, v in state.items()}
            if lora_cfg is not None:  # the adapter (+ score head), and merged on request
                from areal_m2po.engine.lora import save_lora_pretrained

                save_lora_pretrained(self.model, path, inner, lora_cfg.save_merged, self.tokenizer)
            else:
                self.model.save_pretrained(path, state_dict=inner, safe_serialization=True)
                self.tokenizer.save_pretrained(path)
            logger.info("saved reward model (HF format) to %s", path)
        self.accelerator.wait_for_everyone()
        return path

    def train(self) -> None:
        cfg = self.config
        self.stats_logger.start()
        logger.info(
            "training a reward model for %d steps: %s, %d pairs per step, %d train / %d held-out "
            "pairs, output_dir %s",
            self.total_steps,
            cfg.model.path,
            cfg.train_dataset.batch_size,
            len(self.train_pairs),
            len(self.valid_pairs),
            self.output_dir,
        )
        if cfg.evaluator.eval_at_start and self.valid_pairs:
            self.stats_logger.log(0, self.evaluate())
        self._run_epochs("train/epoch", lambda stats: False)

    def close(self) -> None:
        """The loggers, then the process group (:func:`dist.end_process_group`); idempotent."""
        self.stats_logger.close()
        self.accelerator.free_memory()
        dist.end_process_group()


def run(config: RWConfig) -> int:
    """Train a reward model as configured; returns the exit status (2: bad input, one line)."""
    trainer = build_or_report(RWTrainer, config)
    if trainer is None:
        return EXIT_BAD_INPUT
    try:
        trainer.train()
    finally:
        trainer.close()
    return 0
