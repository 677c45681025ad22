"""Supervised fine-tuning: the negative log-likelihood of completion (assistant) tokens.

One step takes ``train_dataset.batch_size`` examples (an equal share per rank), collates this
rank's share into the engine's batch layout (:func:`areal_m2po.dataset.sft.collate_sft`) and
hands it to :meth:`HFTrainEngine.train_batch` with :func:`areal_m2po.algo.sft_loss.sft_nll_loss`
and the number of loss tokens as the micro-batch weight: the engine splits micro-batches, packs
them (``model.mb_spec``), weights each by its share of the loss tokens of every micro-batch of
every rank, clips and steps, so the update is that of the token-mean loss over the global
batch whatever the split. DDP and FSDP2 (``model.backend``) and LoRA (``model.lora``) are the
engine's.

Metrics: ``sft/loss`` (nats per completion token), ``sft/perplexity``, ``sft/n_tokens``,
``sft/grad_norm``, ``sft/lr``, ``sft/epoch``, ``sft/skipped`` (non-finite step),
``sft/loss_scale`` (``model.dtype=float16``); ``eval/loss``, ``eval/perplexity``,
``eval/n_tokens`` on the held-out split. Outputs as the other trainers: ``config.yaml``,
``metrics.jsonl``, ``checkpoints/<tag>`` (HF format), ``recover/step_<N>``.

Data, tokenizer and every example's length are checked before the model loads.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from areal_m2po.algo.sft_loss import sft_nll_loss
from areal_m2po.api.cli_args import SFTConfig, SFTDatasetConfig
from areal_m2po.trainer.run_setup import evaluation_note
from areal_m2po.trainer.step_loop import run_trainer
from areal_m2po.trainer.supervised_trainer import RecoverableSupervisedTrainer
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch

logger = logging.getLogger("areal_m2po.sft_trainer")

__all__ = ["SFT_MUST_MATCH", "SFTTrainer", "run", "sft_loss_weight", "sft_microbatch_loss"]

SFT_MUST_MATCH = (
    "seed",
    "model.path",
    "train_dataset.path",
    "train_dataset.batch_size",
    "train_dataset.shuffle",
)
"""Config items a resumed SFT run must share with the run that wrote the checkpoint."""


def sft_microbatch_loss(
    logp: torch.Tensor, entropy: torch.Tensor, mb: Batch
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The engine's ``MicrobatchLoss`` for SFT: :func:`sft_nll_loss` on the micro-batch's
    loss mask."""
    del entropy
    return sft_nll_loss(logp, mb["loss_mask"])


def sft_loss_weight(mb: Batch) -> float:
    """The engine's ``WeightFn`` for SFT: the micro-batch's number of loss tokens."""
    return float(mb["loss_mask"].sum())


def _load_examples(
    dcfg: SFTDatasetConfig, tokenizer: Any, max_length: int, seed: int
) -> list[dict[str, Any]]:
    from areal_m2po.dataset.sft import load_sft_records, tokenize_sft_records

    records = load_sft_records(
        dcfg.path,
        dcfg.split,
        dcfg.max_samples,
        dcfg.prompt_field,
        dcfg.completion_field,
        dcfg.messages_field,
        seed=seed,
    )
    return tokenize_sft_records(records, tokenizer, max_length, dcfg.use_chat_template)


class SFTTrainer(RecoverableSupervisedTrainer):
    """Builds data, engine and checkpoints from an :class:`SFTConfig` and runs the step loop
    (its start-up, step and state: :class:`~areal_m2po.trainer.supervised_trainer.
    RecoverableSupervisedTrainer`)."""

    metric_prefix = "sft"
    must_match = SFT_MUST_MATCH

    def _load_items(self, dataset: SFTDatasetConfig) -> list[dict[str, Any]]:
        cfg = self.config
        return _load_examples(dataset, self.tokenizer, cfg.max_length, cfg.seed)

    def _build_model(self) -> None:
        from areal_m2po.engine.train_engine import HFTrainEngine

        self.engine = HFTrainEngine(self.config.model, self.accelerator, self.total_steps)

    def _collate(self, examples: list[dict[str, Any]]) -> Batch:
        from areal_m2po.dataset.sft import collate_sft

        return collate_sft(examples, int(self.tokenizer.pad_token_id))

    # -- training -----------------------------------------------------------------------------

    def train_step(self, examples: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step on this rank's ``examples`` (the global batch's token mean)."""
        batch = self._collate(examples)
        train_stats, loss_stats = self.engine.train_batch(
            batch, sft_microbatch_loss, sft_loss_weight
        )
        self.engine.version += 1
        n_tokens = float(dist.all_reduce_sum(batch["loss_mask"].sum().double().reshape(1))[0])
        nll = loss_stats.get("nll", math.nan)
        stats = {
            "sft/loss": nll,
            "sft/perplexity": math.exp(min(nll, 50.0)),
            "sft/n_tokens": n_tokens,
            "sft/grad_norm": train_stats["grad_norm"],
            "sft/lr": train_stats["lr"],
            "sft/skipped": train_stats["skipped"],
        }
        if "loss_scale" in train_stats:  # model.dtype=float16
            stats["sft/loss_scale"] = train_stats["loss_scale"]
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Token-mean NLL and perplexity of the held-out completions (every rank scores a
        strided share; all ranks run as many forwards, as sharded engines need)."""
        if not self.valid_items:
            return {}
        t0 = time.perf_counter()
        sums = torch.zeros(2, dtype=torch.float64)
        for batch in self._eval_chunks():
            logp, _ = self.engine.forward_tokens(batch, 1.0)
            mask = batch["loss_mask"]
            sums += torch.stack([-(logp.double() * mask).sum(), mask.sum().double()])
        total = dist.all_reduce_sum(sums)
        nll = float(total[0] / total[1]) if float(total[1]) else math.nan
        return {
            "eval/loss": nll,
            "eval/perplexity": math.exp(min(nll, 50.0)),
            "eval/n_tokens": float(total[1]),
            "timing/eval_s": time.perf_counter() - t0,
        }

    # -- loop ---------------------------------------------------------------------------------

    def _begin(self) -> None:
        cfg = self.config
        logger.info(
            "supervised fine-tuning for %d steps: %s, %d examples per step, %d train examples "
            "(%s) / %d held-out (%s), LoRA %s, output_dir %s",
            self.total_steps,
            cfg.model.path,
            cfg.train_dataset.batch_size,
            len(self.train_items),
            cfg.train_dataset.path,
            len(self.valid_items),
            evaluation_note(cfg, self.is_main),
            f"r={cfg.model.lora.r}" if cfg.model.lora is not None else "off",
            self.output_dir,
        )


def run(config: SFTConfig) -> int:
    """Fine-tune as configured; returns the exit status (2: bad input, one line; 1:
    a recover checkpoint that does not match, or a run of non-finite steps; 143: stopped by
    SIGTERM after a recover checkpoint)."""
    return run_trainer(SFTTrainer, config)
