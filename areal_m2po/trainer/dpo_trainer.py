"""Direct preference optimization: the policy learns from preference pairs against a frozen
reference, through the SFT trainer's engine.

One step takes ``train_dataset.batch_size`` pairs (an equal share per rank), collates this
rank's share into rows ``[chosen_0, rejected_0, chosen_1, ...]``
(:func:`areal_m2po.dataset.dpo.collate_dpo`), takes the reference's per-token log-probs of the
rows without gradient, and hands the batch to :meth:`HFTrainEngine.train_batch` with
:class:`DPOLoss` (:mod:`areal_m2po.algo.dpo`), the number of pairs as the micro-batch weight and
``group_size=2`` (a pair's two rows share a micro-batch). The engine splits, packs, weighs each
micro-batch by its share of the pairs of every rank, clips and steps, so the update is that of
the pair-mean loss over the global batch whatever the split. DDP and FSDP2 (``model.backend``)
and LoRA (``model.lora``) are the engine's.

The reference (``ref_path``, null: the start model) is a frozen engine with the policy's
backend, or, with LoRA, the policy itself with the adapter disabled
(:class:`~areal_m2po.engine.lora_reference.LoRABaseReference`).

Metrics: ``dpo/loss``, ``dpo/chosen_reward``, ``dpo/rejected_reward`` (means of the implicit
rewards ``beta * log(pi / pi_ref)``), ``dpo/margin``, ``dpo/accuracy`` (share of pairs whose
chosen reward is higher; a tie counts as wrong, so it is 0 while pi = pi_ref),
``dpo/chosen_logp``, ``dpo/rejected_logp`` (mean summed completion log-probs), ``dpo/n_pairs``,
``dpo/grad_norm``, ``dpo/lr``, ``dpo/epoch``, ``dpo/skipped`` (non-finite step),
``dpo/loss_scale`` (``model.dtype=float16``); at evaluations ``eval/loss``,
``eval/accuracy``, ``eval/margin``, ``eval/chosen_reward``, ``eval/rejected_reward``,
``eval/chosen_logp``, ``eval/rejected_logp``, ``eval/n_pairs`` on the held-out pairs. Outputs as the other trainers: ``config.yaml``,
``metrics.jsonl``, ``checkpoints/<tag>`` (HF format), ``recover/step_<N>``.

Data, tokenizer and every pair's length are checked before the model loads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from areal_m2po.algo.dpo import (
    dpo_pair_logratios,
    dpo_preference_loss,
    dpo_reward_stats,
    pair_sequence_logps,
)
from areal_m2po.api.cli_args import DPOConfig, PreferenceDatasetConfig, TrainEngineConfig
from areal_m2po.trainer.run_setup import evaluation_note
from areal_m2po.trainer.step_loop import run_trainer
from areal_m2po.trainer.supervised_trainer import RecoverableSupervisedTrainer
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch

logger = logging.getLogger("areal_m2po.dpo_trainer")

__all__ = ["DPO_MUST_MATCH", "DPOLoss", "DPOTrainer", "dpo_loss_weight", "run"]

DPO_MUST_MATCH = (
    "seed",
    "model.path",
    "ref_path",
    "train_dataset.path",
    "train_dataset.batch_size",
    "train_dataset.shuffle",
)
"""Config items a resumed DPO run must share with the run that wrote the checkpoint."""


@dataclass(frozen=True)
class DPOLoss:
    """The engine's ``MicrobatchLoss`` for DPO: the mean preference loss of the micro-batch's
    pairs (rows ``2i``/``2i + 1``: chosen/rejected) against ``mb["ref_logp"]``, with the
    pair-mean metrics as stats."""

    beta: float
    label_smoothing: float = 0.0
    loss_type: str = "sigmoid"

    @property
    def average(self) -> bool:
        """Whether log-ratios are per completion token (IPO) rather than summed."""
        return self.loss_type == "ipo"

    def __call__(
        self, logp: torch.Tensor, entropy: torch.Tensor, mb: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        del entropy
        mask = mb["loss_mask"]
        chosen, rejected = dpo_pair_logratios(logp, mb["ref_logp"], mask, self.average)
        per_pair = dpo_preference_loss(
            chosen - rejected,
            beta=self.beta,
            label_smoothing=self.label_smoothing,
            loss_type=self.loss_type,
        )
        logps = pair_sequence_logps(logp.detach(), mask)
        stats = dpo_reward_stats(chosen, rejected, self.beta)
        stats.update(
            loss=per_pair.detach().mean(),
            chosen_logp=logps[:, 0].mean(),
            rejected_logp=logps[:, 1].mean(),
        )
        return per_pair.mean(), stats


def dpo_loss_weight(mb: Batch) -> float:
    """The engine's ``WeightFn`` for DPO: the micro-batch's number of pairs."""
    return mb["input_ids"].shape[0] / 2


def _load_pairs(
    dcfg: PreferenceDatasetConfig, tokenizer: Any, max_length: int
) -> list[dict[str, Any]]:
    from areal_m2po.dataset.dpo import tokenize_dpo_pairs
    from areal_m2po.dataset.preference import load_preference_records

    assert dcfg.path is not None
    records = load_preference_records(dcfg.path, dcfg.split, dcfg.max_samples, conversational=True)
    return tokenize_dpo_pairs(records, tokenizer, max_length, dcfg.use_chat_template)


class DPOTrainer(RecoverableSupervisedTrainer):
    """Builds data, policy, reference and checkpoints from a :class:`DPOConfig` and runs the
    step loop (its start-up, step and state: :class:`~areal_m2po.trainer.supervised_trainer.
    RecoverableSupervisedTrainer`)."""

    metric_prefix = "dpo"
    must_match = DPO_MUST_MATCH
    config: DPOConfig

    def _load_items(self, dataset: PreferenceDatasetConfig) -> list[dict[str, Any]]:
        return _load_pairs(dataset, self.tokenizer, self.config.max_length)

    def _build_model(self) -> None:
        from areal_m2po.engine.train_engine import HFTrainEngine

        cfg = self.config
        self.engine = HFTrainEngine(cfg.model, self.accelerator, self.total_steps)
        self.reference = self._build_reference()
        self.loss = DPOLoss(cfg.beta, cfg.label_smoothing, cfg.loss_type)
        self._valid_ref: list[torch.Tensor] | None = None  # the reference's held-out sums

    def _build_reference(self) -> Any:
        """The frozen reference: the LoRA policy's own base model when ``ref_path`` is null
        (or the policy's path), else a frozen engine loading ``ref_path`` or ``model.path``."""
        cfg = self.config
        base = self.engine.adapter_base_reference()  # None without LoRA
        if base is not None and cfg.ref_path in (None, cfg.model.path):
            return base
        from areal_m2po.engine.train_engine import HFTrainEngine

        ref_cfg = TrainEngineConfig(
            path=cfg.ref_path or cfg.model.path,
            dtype=cfg.model.dtype,
            attn_implementation=cfg.model.attn_implementation,
            backend=cfg.model.backend,
            fsdp=cfg.model.fsdp,
            mb_spec=cfg.model.mb_spec,
        )
        return HFTrainEngine(ref_cfg, self.accelerator, 0, trainable=False)

    def _collate(self, pairs: list[dict[str, Any]]) -> Batch:
        from areal_m2po.dataset.dpo import collate_dpo

        return collate_dpo(pairs, int(self.tokenizer.pad_token_id))

    # -- training -----------------------------------------------------------------------------

    def train_step(self, pairs: list[dict[str, Any]]) -> dict[str, float]:
        """One optimizer step on this rank's ``pairs`` (the global batch's pair mean)."""
        batch = self._collate(pairs)
        batch["ref_logp"], _ = self.reference.forward_tokens(batch, 1.0)
        train_stats, loss_stats = self.engine.train_batch(
            batch, self.loss, dpo_loss_weight, group_size=2
        )
        self.engine.version += 1
        n_pairs = float(dist.all_reduce_sum(torch.tensor([float(len(pairs))]))[0])
        stats = {f"dpo/{k}": v for k, v in loss_stats.items()}
        stats.update(
            {
                "dpo/n_pairs": n_pairs,
                "dpo/grad_norm": train_stats["grad_norm"],
                "dpo/lr": train_stats["lr"],
                "dpo/skipped": train_stats["skipped"],
            }
        )
        if "loss_scale" in train_stats:  # model.dtype=float16
            stats["dpo/loss_scale"] = train_stats["loss_scale"]
        return stats

    def _sequence_sums(self, model: Any, chunks: list[Batch]) -> list[torch.Tensor]:
        """``[p, 2]`` summed completion log-probs of each chunk's pairs under ``model`` (a
        ``forward_tokens`` holder; a sharded engine runs idle forwards for an empty chunk)."""
        out = []
        for batch in chunks:
            logp, _ = model.forward_tokens(batch, 1.0)
            if batch["input_ids"].shape[0] == 0:
                out.append(torch.zeros(0, 2, dtype=torch.float64))
            else:
                out.append(pair_sequence_logps(logp, batch["loss_mask"]))
        return out

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The DPO loss, the implicit-reward metrics and the completions' log-probs over every
        held-out pair (each rank scores a strided share; the reference's sums are computed
        once and kept)."""
        if not self.valid_items:
            return {}
        t0 = time.perf_counter()
        chunks = self._eval_chunks()
        if self._valid_ref is None:
            self._valid_ref = self._sequence_sums(self.reference, chunks)
        policy = torch.cat(self._sequence_sums(self.engine, chunks))
        ratios = policy - torch.cat(self._valid_ref)
        if self.loss.average:  # IPO: per completion token
            ratios = ratios / torch.cat([b["loss_mask"].sum(-1).view(-1, 2) for b in chunks])
        # [P, 4]: chosen and rejected log-ratios, chosen and rejected log-probs
        local = torch.cat([ratios, policy], dim=1).flatten()
        both = dist.all_gather_cat(local)[0].view(-1, 4)
        chosen, rejected = both[:, 0], both[:, 1]
        loss = dpo_preference_loss(
            chosen - rejected,
            beta=self.loss.beta,
            label_smoothing=self.loss.label_smoothing,
            loss_type=self.loss.loss_type,
        )
        rewards = dpo_reward_stats(chosen, rejected, self.loss.beta)
        stats = {f"eval/{k}": float(v) for k, v in rewards.items()}
        stats.update(
            {
                "eval/loss": float(loss.mean()),
                "eval/chosen_logp": float(both[:, 2].mean()),
                "eval/rejected_logp": float(both[:, 3].mean()),
                "eval/n_pairs": float(chosen.numel()),
                "timing/eval_s": time.perf_counter() - t0,
            }
        )
        return stats

    # -- loop ---------------------------------------------------------------------------------

    def _begin(self) -> None:
        cfg = self.config
        logger.info(
            "DPO (%s, beta %g) for %d steps: %s, %d pairs per step, %d train pairs (%s) / %d "
            "held-out (%s), reference %s, LoRA %s, output_dir %s",
            cfg.loss_type,
            cfg.beta,
            self.total_steps,
            cfg.model.path,
            cfg.train_dataset.batch_size,
            len(self.train_items),
            cfg.train_dataset.path,
            len(self.valid_items),
            evaluation_note(cfg, self.is_main),
            type(self.reference).__name__,
            f"r={cfg.model.lora.r}" if cfg.model.lora is not None else "off",
            self.output_dir,
        )


def run(config: DPOConfig) -> int:
    """Train with DPO as configured; returns the exit status (2: bad input, one line; 1:
    a recover checkpoint that does not match, or a run of non-finite steps; 143: stopped by
    SIGTERM after a recover checkpoint)."""
    return run_trainer(DPOTrainer, config)
