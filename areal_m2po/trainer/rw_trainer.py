"""Reward-model training: a Bradley-Terry reward model learned from preference pairs.

One step takes ``train_dataset.batch_size`` pairs (split across ranks), collates this rank's
share into one row per pair (:func:`collate_pairs`) and hands it to
:meth:`HFTrainEngine.train_batch` with the pair-scoring forward (:func:`score_pairs`: the
``score`` head at the last real token of the chosen and the rejected text,
:func:`areal_m2po.reward.reward_model.forward_scores`), the micro-batch loss
:class:`PairLoss` (:func:`areal_m2po.algo.bradley_terry.bradley_terry_loss`) and the number of
pairs as the micro-batch weight: the engine splits micro-batches (``model.mb_spec``), weights
each by its share of the pairs of every rank, clips, skips a non-finite step and steps, so the
update is that of the loss averaged over the global batch whatever the split.
Metrics (TRL's names under ``train/`` and ``eval/``: ``loss``, ``accuracy``, ``margin``,
``mean_reward``, ``min_reward``, ``max_reward``) go to ``metrics.jsonl``; the model is saved in
Hugging Face format (``AutoModelForSequenceClassification.from_pretrained``-loadable, tokenizer
alongside) to ``<output_dir>/checkpoints/final``.

Data, tokenizer and every pair's length are checked before the model loads.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch

from areal_m2po.algo.bradley_terry import bradley_terry_loss, preference_stats
from areal_m2po.api.cli_args import (
    PreferenceDatasetConfig,
    RWConfig,
    RWModelConfig,
    TrainEngineConfig,
)
from areal_m2po.engine.hf_model import as_pretrained
from areal_m2po.trainer.run_setup import evaluation_note
from areal_m2po.trainer.step_loop import run_trainer
from areal_m2po.trainer.supervised_trainer import SupervisedTrainer
from areal_m2po.utils import dist

logger = logging.getLogger("areal_m2po.rw_trainer")

__all__ = ["PairLoss", "RWTrainer", "collate_pairs", "pair_count", "run", "score_pairs"]


def _load_pairs(
    dcfg: PreferenceDatasetConfig, tokenizer: Any, max_length: int
) -> list[dict[str, Any]]:
    from areal_m2po.dataset.preference import load_preference_records, tokenize_preference_pairs

    assert dcfg.path is not None
    records = load_preference_records(dcfg.path, dcfg.split, dcfg.max_samples)
    return tokenize_preference_pairs(records, tokenizer, max_length, dcfg.use_chat_template)


def collate_pairs(pairs: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """One row per pair: ``input_ids`` / ``attention_mask`` int64 ``[P, 2, T]`` (the chosen
    text at ``[:, 0]``, the rejected at ``[:, 1]``, right-padded with ``pad_id`` to the longest
    of the ``2P`` texts) and, when any pair has one, ``margin`` float32 ``[P]`` (0 for the
    others)."""
    from areal_m2po.reward.reward_model import pad_sequences

    seqs = [p["chosen_ids"] for p in pairs] + [p["rejected_ids"] for p in pairs]
    ids, mask = pad_sequences(seqs, pad_id, "right")
    n = len(pairs)
    batch = {
        "input_ids": torch.stack([ids[:n], ids[n:]], dim=1),
        "attention_mask": torch.stack([mask[:n], mask[n:]], dim=1),
    }
    if any("margin" in p for p in pairs):
        batch["margin"] = torch.tensor([p.get("margin", 0.0) for p in pairs])
    return batch


def score_pairs(
    model: torch.nn.Module, mb: dict[str, torch.Tensor], temperature: float, entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's ``ForwardFn`` for a reward model (a
    :class:`~areal_m2po.reward.reward_model.LastTokenScorer`): rewards ``[p, 2]`` (chosen,
    rejected) of the micro-batch's pairs from one forward of its ``2p`` texts (columns that
    are padding in every text dropped), and zeros ``[p, 2]``."""
    del temperature, entropy
    ids, mask = mb["input_ids"], mb["attention_mask"]
    width = int(mask.sum(-1).max())  # the longest text: right padding beyond it
    flat_ids = torch.cat([ids[:, 0, :width], ids[:, 1, :width]])
    flat_mask = torch.cat([mask[:, 0, :width], mask[:, 1, :width]])
    scores = model(flat_ids, flat_mask).view(2, -1).T
    return scores, torch.zeros_like(scores)


def pair_count(mb: dict[str, torch.Tensor]) -> float:
    """The engine's ``WeightFn`` for a reward model: the micro-batch's number of pairs."""
    return float(mb["input_ids"].shape[0])


class PairLoss:
    """The engine's ``MicrobatchLoss`` for a reward model: the Bradley-Terry loss of the
    micro-batch's rewards ``[p, 2]`` (with its ``margin`` and the centring term), averaged over
    its pairs; stats ``{"loss"}``. Keeps each micro-batch's rewards (detached) in ``chosen`` /
    ``rejected`` for the step's metrics.
    """

    def __init__(self, center_rewards_coefficient: float) -> None:
        self.coef = center_rewards_coefficient
        self.chosen: list[torch.Tensor] = []
        self.rejected: list[torch.Tensor] = []

    def __call__(
        self, scores: torch.Tensor, aux: torch.Tensor, mb: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        del aux
        chosen, rejected = scores[:, 0], scores[:, 1]
        self.chosen.append(chosen.detach())
        self.rejected.append(rejected.detach())
        loss = bradley_terry_loss(chosen, rejected, mb.get("margin"), self.coef)
        return loss, {"loss": loss.detach()}


def _engine_config(mcfg: RWModelConfig) -> TrainEngineConfig:
    """The train engine's settings for the reward model: its optimizer, micro-batch split and
    dropout. LoRA and gradient checkpointing are already on the model the engine is given."""
    return TrainEngineConfig(
        path=mcfg.path,
        dtype=mcfg.dtype,
        attn_implementation=mcfg.attn_implementation,
        optimizer=mcfg.optimizer,
        mb_spec=mcfg.mb_spec,
        max_consecutive_skipped_steps=mcfg.max_consecutive_skipped_steps,
        disable_dropout=mcfg.disable_dropout,
    )


class RWTrainer(SupervisedTrainer):
    """Builds data, model and optimizer from an :class:`RWConfig` and runs the step loop (its
    start-up and step: :class:`~areal_m2po.trainer.supervised_trainer.SupervisedTrainer`; no
    recover checkpoints, no launch checks, an epoch's last batch split in equal shares)."""

    metric_prefix = "train"
    checks_launch = False
    even_batches = False
    config: RWConfig

    def _load_tokenizer(self) -> Any:
        from areal_m2po.reward.reward_model import load_reward_tokenizer

        return load_reward_tokenizer(self.config.tokenizer_path or self.config.model.path)

    def _load_items(self, dataset: PreferenceDatasetConfig) -> list[dict[str, Any]]:
        return _load_pairs(dataset, self.tokenizer, self.config.max_length)

    def _build_model(self) -> None:
        from areal_m2po.engine.precision import load_dtype
        from areal_m2po.engine.train_engine import HFTrainEngine
        from areal_m2po.reward.reward_model import LastTokenScorer, load_reward_model

        mcfg = self.config.model
        dtype = load_dtype(mcfg.dtype, True, mcfg.lora is not None)  # float16: float32 masters
        model = load_reward_model(
            mcfg.path, dtype, mcfg.attn_implementation, self.tokenizer.pad_token_id
        )
        if mcfg.gradient_checkpointing:
            as_pretrained(model).gradient_checkpointing_enable()
        if mcfg.lora is not None:  # adapters and the score head train; the body stays frozen
            from areal_m2po.engine.lora import apply_lora

            model = apply_lora(model, mcfg.lora)
            if mcfg.gradient_checkpointing:
                as_pretrained(model).enable_input_require_grads()
        self._scored = model  # the engine trains it inside its scorer, in place
        self.engine = HFTrainEngine(
            _engine_config(mcfg),
            self.accelerator,
            self.total_steps,
            model=LastTokenScorer(model),
            forward_fn=score_pairs,
        )

    @property
    def model(self) -> torch.nn.Module:
        """The (unwrapped) sequence-classification model."""
        return self._scored

    # -- scoring ------------------------------------------------------------------------------

    def _pair_scores(self, pairs: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) rewards ``[P]`` of ``pairs`` in one forward (right padding)."""
        batch = collate_pairs(pairs, self.tokenizer.pad_token_id)
        scores, _ = self.engine.forward_whole(batch)  # score_pairs, in eval mode
        return scores[:, 0], scores[:, 1]

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
        loss_fn = PairLoss(self.config.center_rewards_coefficient or 0.0)
        batch = collate_pairs(pairs, self.tokenizer.pad_token_id)
        train_stats, loss_stats = self.engine.train_batch(batch, loss_fn, pair_count)
        stats = self._gathered_stats(loss_fn.chosen, loss_fn.rejected, "train")
        stats.update(
            {
                "train/loss": loss_stats["loss"],
                "train/grad_norm": train_stats["grad_norm"],
                "train/lr": train_stats["lr"],
                "train/skipped": train_stats["skipped"],
            }
        )
        return stats

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss and TRL's metrics on the held-out pairs (each rank scores a strided share)."""
        if not self.valid_items:
            return {}
        t0 = time.perf_counter()
        mine = self.valid_items[self.rank :: self.world]
        bs = self.config.valid_dataset.batch_size if self.config.valid_dataset else 16
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
        state = self.engine.full_state_dict()
        lora_cfg = self.config.model.lora
        if self.is_main:
            inner = {k.removeprefix("model."): v for k, v in state.items()}
            if lora_cfg is not None:  # the adapter (+ score head), and merged on request
                from areal_m2po.engine.lora import save_lora_pretrained

                save_lora_pretrained(self.model, path, inner, lora_cfg.save_merged, self.tokenizer)
            else:
                as_pretrained(self.model).save_pretrained(
                    path, state_dict=inner, safe_serialization=True
                )
                self.tokenizer.save_pretrained(path)
            logger.info("saved reward model (HF format) to %s", path)
        self.accelerator.wait_for_everyone()
        return path

    def _begin(self) -> None:
        cfg = self.config
        logger.info(
            "training a reward model for %d steps: %s, %d pairs per step, %d train pairs (%s) / "
            "%d held-out (%s), output_dir %s",
            self.total_steps,
            cfg.model.path,
            cfg.train_dataset.batch_size,
            len(self.train_items),
            cfg.train_dataset.path,
            len(self.valid_items),
            evaluation_note(cfg, self.is_main),
            self.output_dir,
        )


def run(config: RWConfig) -> int:
    """Train a reward model as configured; returns the exit status (2: bad input, one line;
    1: a run of non-finite steps)."""
    return run_trainer(RWTrainer, config)
