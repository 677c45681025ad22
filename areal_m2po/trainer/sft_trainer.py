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
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from areal_m2po.algo.sft_loss import sft_nll_loss
from areal_m2po.api.cli_args import SFTConfig, SFTDatasetConfig
from areal_m2po.api.errors import RunError
from areal_m2po.trainer.checkpoints import RecoverCheckpoints
from areal_m2po.trainer.preflight import check_batch_split, check_engine_launch
from areal_m2po.trainer.run_setup import (
    EXIT_BAD_INPUT,
    build_or_report,
    evaluation_note,
    make_stats_logger,
    start_run,
    write_run_config,
)
from areal_m2po.trainer.step_loop import RecoverableStepLoop, epoch_loader
from areal_m2po.utils import dist, recover
from areal_m2po.utils.console import print_error
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


class SFTTrainer(RecoverableStepLoop):
    """Builds data, engine and checkpoints from an :class:`SFTConfig` and runs the step loop
    (its bookkeeping: :class:`~areal_m2po.trainer.step_loop.RecoverableStepLoop`)."""

    def __init__(self, config: SFTConfig) -> None:
        self.config = cfg = config
        ctx = start_run(cfg)
        self.accelerator, self.is_main = ctx.accelerator, ctx.is_main
        self.rank, self.world, self.output_dir = ctx.rank, ctx.world, ctx.output_dir
        check_engine_launch(
            [("model", cfg.model)],
            self.accelerator.distributed_type.value,
            self.world,
            torch.cuda.is_available(),
            str(self.accelerator.mixed_precision),
        )
        self._build_data()
        from areal_m2po.engine.train_engine import HFTrainEngine

        self.engine = HFTrainEngine(cfg.model, self.accelerator, self.total_steps)
        self.stats_logger = make_stats_logger(cfg, ctx)
        self.checkpoints = RecoverCheckpoints(cfg, self.output_dir, self.is_main, SFT_MUST_MATCH)
        self.step = 0
        self.stop_requested = False

    def _build_data(self) -> None:
        from transformers import AutoTokenizer

        from areal_m2po.engine.builtin_models import resolve_model_path

        cfg = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(cfg.tokenizer_path or cfg.model.path)
        )
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.train_examples = _load_examples(
            cfg.train_dataset, self.tokenizer, cfg.max_length, cfg.seed
        )
        self.valid_examples = (
            _load_examples(cfg.valid_dataset, self.tokenizer, cfg.max_length, cfg.seed)
            if cfg.valid_dataset is not None
            else []
        )
        check_batch_split(cfg.train_dataset.batch_size, self.world)
        if self.world > 1 and not cfg.train_dataset.drop_last:
            raise ValueError(
                "train_dataset.drop_last must be true with several processes (an epoch's last, "
                "smaller batch would not split evenly over the ranks)"
            )
        self.loader, self.total_steps = epoch_loader(self.train_examples, cfg)

    def _collate(self, examples: list[dict[str, Any]]) -> Batch:
        from areal_m2po.dataset.sft import collate_sft

        return collate_sft(examples, int(self.tokenizer.pad_token_id))

    # -- training -----------------------------------------------------------------------------

    def _local_rows(self, items: list[Any]) -> list[Any]:
        """This rank's share of a global batch (the last batch of an epoch may be uneven)."""
        return items[self.rank :: self.world]

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
        if not self.valid_examples:
            return {}
        t0 = time.perf_counter()
        mine = self.valid_examples[self.rank :: self.world]
        assert self.config.valid_dataset is not None
        bs = self.config.valid_dataset.batch_size
        n_chunks = math.ceil(math.ceil(len(self.valid_examples) / self.world) / bs)
        sums = torch.zeros(2, dtype=torch.float64)
        for i in range(n_chunks):
            batch = self._collate(mine[i * bs : (i + 1) * bs])
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

    def save_hf(self, tag: str) -> str:
        return self._save_engine_hf(self.engine, tag, "model")

    # -- state (recover checkpoints) ----------------------------------------------------------

    def state_dict(self, shard_dir: str | None = None) -> dict[str, Any]:
        """This rank's state: ``trainer`` (step, loader position), ``model`` (the engine's
        weights, optimizer, scheduler; sharded into ``shard_dir/model_shards``), ``rank`` (RNG)."""
        shards = None if shard_dir is None else os.path.join(shard_dir, "model_shards")
        return {
            "trainer": {
                "step": self.step,
                "loader": self.loader.state_dict(),
                "skip_streaks": dict(self.skip_streaks or {}),
            },
            "model": self.engine.training_state(shards),
            "rank": {"rank": self.rank, "rng": recover.capture_rng()},
        }

    def _state_loaders(self, shard_dir: str | None) -> list[tuple[str, Callable[[Any], None]]]:
        shards = None if shard_dir is None else os.path.join(shard_dir, "model_shards")

        def load_trainer(state: Mapping[str, Any]) -> None:
            self.loader.load_state_dict(state["loader"])
            self.step = int(state["step"])
            self.skip_streaks = {k: int(v) for k, v in state.get("skip_streaks", {}).items()}

        return [
            ("trainer", load_trainer),
            ("model", lambda state: self.engine.load_training_state(state, shards)),
            ("rank", lambda state: recover.restore_rng(state["rng"])),
        ]

    # -- loop ---------------------------------------------------------------------------------

    def _train(self) -> None:
        cfg = self.config
        resumed = self.resume()
        write_run_config(cfg, self)
        self.stats_logger.start(resume_step=self.step + 1 if resumed else 0)
        logger.info(
            "supervised fine-tuning for %d steps: %s, %d examples per step, %d train examples "
            "(%s) / %d held-out (%s), LoRA %s, output_dir %s",
            self.total_steps,
            cfg.model.path,
            cfg.train_dataset.batch_size,
            len(self.train_examples),
            cfg.train_dataset.path,
            len(self.valid_examples),
            evaluation_note(cfg, self.is_main),
            f"r={cfg.model.lora.r}" if cfg.model.lora is not None else "off",
            self.output_dir,
        )
        if cfg.evaluator.eval_at_start and self.step == 0 and self.valid_examples:
            self.stats_logger.log(0, self.evaluate())
        self._run_epochs(
            "sft/epoch", lambda stats: self._checkpoint_after_step(not stats.get("sft/skipped"))
        )


def run(config: SFTConfig) -> int:
    """Fine-tune as configured; returns the exit status (2: bad input, one line; 1:
    a recover checkpoint that does not match, or a run of non-finite steps; 143: stopped by
    SIGTERM after a recover checkpoint)."""
    trainer = build_or_report(SFTTrainer, config)
    if trainer is None:
        return EXIT_BAD_INPUT
    try:
        trainer.train()
    except RunError as exc:  # a checkpoint that does not match, non-finite steps, SIGTERM
        print_error(exc)
        return exc.exit_status
    finally:
        trainer.close()
    return 0
