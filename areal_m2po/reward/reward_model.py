"""A learned (Bradley-Terry) reward model: loading, scoring text, and the reward it gives PPO.

The model is ``AutoModelForSequenceClassification`` with one label (``LlamaForSequenceClassification``
for SmolLM2 and ``builtin:tiny``): a causal LM body with a scalar ``score`` head. A sequence's
reward is the head's output at its **last attended token** (the last position whose attention
mask is set), read here from the full ``[B, T, 1]`` head output, so left- and right-padded
batches give the same scores as an unpadded forward (position ids restart at each sequence's
first real token). For an unpadded sequence that does not end in the pad token, that is the
position ``AutoModelForSequenceClassification`` pools itself, so a saved model loaded with
``from_pretrained`` and called directly gives the same reward.

:class:`LearnedReward` is what the PPO trainer calls: it renders each (prompt, completion) with
:func:`areal_m2po.dataset.preference.reward_model_text` (the layout ``train_rm`` trained on),
scores them in batches, normalises the scores (``batch`` or ``running`` statistics, taken over
all ranks) and mixes in the verifiable reward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch

from areal_m2po.algo.bradley_terry import pool_last_token
from areal_m2po.api.cli_args import RewardModelConfig
from areal_m2po.dataset.preference import encode_reward_model_text
from areal_m2po.engine.builtin_models import resolve_model_path
from areal_m2po.engine.hf_model import PeftModel
from areal_m2po.utils import dist

__all__ = [
    "LastTokenScorer",
    "LearnedReward",
    "RunningMoments",
    "forward_scores",
    "load_reward_model",
    "load_reward_tokenizer",
    "pad_sequences",
    "score_token_ids",
]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_reward_tokenizer(path: str) -> Any:
    """The tokenizer at ``path`` (``builtin:`` resolved), with a pad token (eos if it had none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_reward_model(
    path: str, dtype: str, attn_implementation: str, pad_token_id: int
) -> torch.nn.Module:
    """``AutoModelForSequenceClassification`` with one label from ``path``.

    ``path`` is a causal LM (a fresh, seeded-by-the-caller ``score`` head is added on its body)
    or a saved reward model. ``config.pad_token_id`` is set so the saved model pools the same
    token when called by itself.
    """
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_model_path(path),
        num_labels=1,
        dtype=_DTYPES[dtype],
        attn_implementation=attn_implementation,
    )
    model.config.pad_token_id = pad_token_id
    if not hasattr(model, "score") or not hasattr(model, "base_model"):
        raise ValueError(
            f"reward model {path!r} ({type(model).__name__}) has no 'score' head on a base "
            "model; use a decoder LM whose *ForSequenceClassification has one (Llama, Qwen2, "
            "Mistral, SmolLM2, ...)"
        )
    return model


def pad_sequences(
    sequences: Sequence[Sequence[int]], pad_id: int, side: str = "right"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)``, both int64 ``[B, T]`` with ``T`` the longest sequence,
    padded with ``pad_id`` on ``side`` ("left" or "right")."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("pad_sequences needs at least one sequence and no empty sequence")
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, seq in enumerate(sequences):
        cols = slice(0, len(seq)) if side == "right" else slice(width - len(seq), width)
        ids[row, cols] = torch.tensor(list(seq), dtype=torch.long)
        mask[row, cols] = 1
    return ids, mask


def forward_scores(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Rewards ``[B]`` float32: the ``score`` head at each row's last attended token.

    ``input_ids``/``attention_mask`` are ``[B, T]`` with padding on either side; position ids
    count the attended tokens, so padding does not change a score. Keeps the autograd graph.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    if callable(getattr(model, "get_base_model", None)):  # peft (LoRA): its adapted model
        model = cast(PeftModel, model).get_base_model()
    body = model.base_model  # the transformer under the score head
    if not isinstance(body, torch.nn.Module):
        raise TypeError(f"{type(model).__name__}.base_model is not a module")
    hidden = body(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state
    head = model.score(hidden)  # type: ignore[operator]  # [B, T, 1]
    return pool_last_token(head.float(), attention_mask)


class LastTokenScorer(torch.nn.Module):
    """``forward(input_ids, attention_mask) -> [B]`` rewards of a sequence-classification model
    (:func:`forward_scores`), as one module so DDP sees the whole forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return forward_scores(self.model, input_ids, attention_mask)


@torch.no_grad()
def score_token_ids(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    batch_size: int,
    device: torch.device | str,
    padding_side: str = "right",
) -> torch.Tensor:
    """Rewards ``[N]`` float32 (on the CPU) of ``sequences`` scored ``batch_size`` at a time."""
    was_training = model.training
    model.eval()
    out = []
    try:
        for start in range(0, len(sequences), batch_size):
            ids, mask = pad_sequences(sequences[start : start + batch_size], pad_id, padding_side)
            out.append(forward_scores(model, ids.to(device), mask.to(device)).cpu())
    finally:
        model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0)


class RunningMoments:
    """Count, mean and variance of every score seen, merged batch by batch (Chan et al.'s
    parallel update, exact in float64). ``std`` is the population standard deviation."""

    def __init__(self) -> None:
        self.count = 0.0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    def update(self, count: float, mean: float, m2: float) -> None:
        """Merge a batch given as its count, mean and sum of squared deviations."""
        if count <= 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * count / total
        self.m2 += m2 + delta * delta * self.count * count / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count > 0 else 0.0

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count, self.mean, self.m2 = (float(state[k]) for k in ("count", "mean", "m2"))


def _global_moments(x: torch.Tensor) -> tuple[float, float, float]:
    """(count, mean, sum of squared deviations) of ``x`` over all ranks (float64)."""
    x = x.double().cpu()
    local = torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64), x.sum()])
    count, total = dist.all_reduce_sum(local).tolist()
    mean = total / count if count else 0.0
    m2 = float(dist.all_reduce_sum(((x - mean) ** 2).sum().reshape(1))[0])
    return count, mean, m2


class LearnedReward:
    """The reward a trained reward model gives PPO samples (one per rank; see module doc).

    Args:
        config: the ``reward.model`` section.
        default_device: the trainer's device (used when ``config.device`` is null).
    """

    def __init__(self, config: RewardModelConfig, default_device: torch.device | str) -> None:
        assert config.path is not None
        self.config = config
        self.device = torch.device(config.device) if config.device else torch.device(default_device)
        self.tokenizer = load_reward_tokenizer(config.tokenizer_path or config.path)
        self.model = load_reward_model(
            config.path, config.dtype, config.attn_implementation, self.tokenizer.pad_token_id
        )
        self.model.requires_grad_(False)
        self.model.eval()
        self.model.to(self.device)
        self.moments = RunningMoments()

    def raw_scores(self, prompts: Sequence[str], completions: Sequence[str]) -> torch.Tensor:
        """Reward-model scores ``[N]`` float32 of (prompt, completion) pairs (this rank's)."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        ids = [
            encode_reward_model_text(self.tokenizer, p, c, self.config.use_chat_template)
            for p, c in zip(prompts, completions)
        ]
        return score_token_ids(
            self.model, ids, self.tokenizer.pad_token_id, self.config.batch_size, self.device
        )

    def normalise(self, scores: torch.Tensor) -> torch.Tensor:
        """Scores normalised as ``config.norm`` says (statistics over all ranks)."""
        norm = self.config.norm
        if norm is None:
            return scores
        count, mean, m2 = _global_moments(scores)
        if norm == "running":
            self.moments.update(count, mean, m2)
            mean, std = self.moments.mean, self.moments.std
        else:
            std = math.sqrt(m2 / count) if count else 0.0
        return ((scores.double() - mean) / (std + self.config.norm_eps)).float()

    def rewards(
        self, prompts: Sequence[str], completions: Sequence[str], verifiable: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``weight * normalise(score) + verifiable_weight * verifiable`` per sample ``[N]``,
        and global stats: ``reward/model_score`` (mean raw score), ``reward/model_score_std``,
        ``reward/verifiable`` (mean verifiable reward) and ``reward/model_verifiable_corr``
        (Pearson correlation of raw score and verifiable reward over the batch; 0 when either
        is constant)."""
        return self.combine(self.raw_scores(prompts, completions), verifiable)

    def combine(
        self, raw: torch.Tensor, verifiable: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """:meth:`rewards` from raw scores ``[N]`` already computed (the batch's, in order;
        normalisation and stats are over all ranks, so every rank calls it once per batch)."""
        rewards = self.config.weight * self.normalise(raw)
        if self.config.verifiable_weight:
            rewards = rewards + self.config.verifiable_weight * verifiable.float()
        return rewards, _score_stats(raw, verifiable.float())

    def mix_raw(self, raw: float, verifiable: float) -> float:
        """One sample's reward from its raw score without normalisation (``norm`` null:
        what :meth:`combine` gives it; otherwise a provisional value until the batch's)."""
        reward = self.config.weight * torch.tensor(raw, dtype=torch.float32)
        if self.config.verifiable_weight:
            reward = reward + self.config.verifiable_weight * torch.tensor(verifiable).float()
        return float(reward)

    def state_dict(self) -> dict[str, Any]:
        return {"moments": self.moments.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.moments.load_state_dict(state["moments"])


def _score_stats(raw: torch.Tensor, verifiable: torch.Tensor) -> dict[str, float]:
    x, y = raw.double(), verifiable.double()
    local = torch.stack(
        [
            torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
            x.sum(),
            y.sum(),
            (x * x).sum(),
            (y * y).sum(),
            (x * y).sum(),
        ]
    )
    n, sx, sy, sxx, syy, sxy = dist.all_reduce_sum(local).tolist()
    n = max(n, 1.0)
    var_x = max(sxx / n - (sx / n) ** 2, 0.0)
    var_y = max(syy / n - (sy / n) ** 2, 0.0)
    cov = sxy / n - (sx / n) * (sy / n)
    denom = math.sqrt(var_x * var_y)
    return {
        "reward/model_score": sx / n,
        "reward/model_score_std": math.sqrt(var_x),
        "reward/verifiable": sy / n,
        "reward/model_verifiable_corr": cov / denom if denom > 1e-12 else 0.0,
    }
