"""The PPO critic: a token-level value model trained with the clipped value loss."""

from __future__ import annotations

import torch

from areal_m2po.algo.critic_loss import ppo_critic_loss
from areal_m2po.api.cli_args import CriticConfig
from areal_m2po.engine.builtin_models import resolve_model_path
from areal_m2po.engine.precision import TORCH_DTYPES
from areal_m2po.engine.train_engine import HFTrainEngine
from areal_m2po.utils import dist
from areal_m2po.utils.data import Batch, select_rows, trim_columns


def load_value_model(path: str, dtype: str, attn_implementation: str) -> torch.nn.Module:
    """The LM body with a fresh scalar head (``AutoModelForTokenClassification``, 1 label)."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(
        resolve_model_path(path),
        num_labels=1,
        dtype=TORCH_DTYPES[dtype],
        attn_implementation=attn_implementation,
    )


def forward_values(
    model: torch.nn.Module, mb: Batch, temperature: float, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Values ``V(s_t)`` of the state before each generated token, float32 [b, T].

    ``values[b, t]`` is the head's output at position ``t - 1`` (the prefix that token ``t``
    is sampled from); zero outside ``loss_mask``. The second output is zeros (no entropy).
    """
    del temperature, compute_entropy
    b, full_t = mb["input_ids"].shape
    trimmed, left, right = trim_columns(mb)
    attn = trimmed["attention_mask"]
    position_ids = (attn.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=trimmed["input_ids"], attention_mask=attn.long(), position_ids=position_ids
    )
    head = out.logits[..., 0].float()  # [b, t]: value of the prefix ending at each position
    values = torch.zeros(b, full_t, dtype=torch.float32, device=head.device)
    values[:, left + 1 : right] = head[:, :-1]
    values = values * mb["loss_mask"].float()
    return values, torch.zeros_like(values)


class PPOCritic:
    """Value estimates for GAE and the clipped value-loss update."""

    def __init__(self, config: CriticConfig, engine: HFTrainEngine) -> None:
        self.config = config
        self.engine = engine

    def compute_values(self, batch: Batch) -> torch.Tensor:
        values, _ = self.engine.forward_tokens(batch, temperature=1.0)
        return values

    def _microbatch_loss(
        self, values: torch.Tensor, _aux: torch.Tensor, mb: Batch
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return ppo_critic_loss(
            values=values,
            old_values=mb["values"],
            returns=mb["returns"],
            value_eps_clip=self.config.value_eps_clip,
            loss_mask=mb["loss_mask"],
        )

    def ppo_update(self, batch: Batch) -> dict[str, float]:
        """``ppo_n_minibatches`` optimizer steps on the value loss; returns averaged stats."""
        n = int(batch["input_ids"].shape[0])
        # every rank must take the same number of optimizer steps (DDP syncs each backward)
        k_local = torch.tensor([float(min(self.config.ppo_n_minibatches, n))])
        k = int(-dist.all_reduce_max(-k_local)[0])
        bounds = [round(i * n / k) for i in range(k + 1)]
        out: dict[str, float] = {}
        for i in range(k):
            mb = select_rows(batch, torch.arange(bounds[i], bounds[i + 1]))
            train_stats, loss_stats = self.engine.train_batch(
                mb, self._microbatch_loss, lambda m: float(m["loss_mask"].sum())
            )
            loss_stats["critic/grad_norm"] = train_stats["grad_norm"]
            loss_stats["critic/skipped_steps"] = train_stats["skipped"]
            for key, v in loss_stats.items():
                out[key] = out.get(key, 0.0) + v / k
        self.engine.version += 1
        return out
