"""What AReaL's own workflows share: the reward call (a function or its dotted path, awaited
without blocking the event loop), an engine response as this package's
:class:`~areal_m2po.rollout.workflows.multi_turn.episode.Generated`, and this package's
:class:`~areal_m2po.rollout.workflows.multi_turn.episode.EpisodeTokens` as AReaL's tensor dict
(see :mod:`areal_m2po.areal.api.workflow_api`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from areal_m2po.areal.api.io_struct import ModelResponse
from areal_m2po.areal.api.reward_api import AsyncRewardWrapper
from areal_m2po.areal.utils.wing_paths import import_areal
from areal_m2po.rollout.workflows.multi_turn.episode import EpisodeTokens, Generated

__all__ = ["LazyReward", "episode_tensors", "generated"]


class LazyReward:
    """AReaL's reward call ``await reward(prompt, completions, prompt_ids, completion_ids,
    **data)``; a dotted path (``areal.X`` naming ``areal_m2po.areal.X``) is imported at the
    first call, as AReaL's workflows import it in the episode."""

    def __init__(self, reward_fn: Callable[..., Any] | str) -> None:
        self.reward_fn = reward_fn
        self._wrapped = None if isinstance(reward_fn, str) else AsyncRewardWrapper(reward_fn)

    async def __call__(self, *args: Any, **data: Any) -> Any:
        if self._wrapped is None:
            fn = import_areal(str(self.reward_fn))
            self.reward_fn, self._wrapped = fn, AsyncRewardWrapper(fn)
        return await self._wrapped(*args, **data)


def generated(resp: ModelResponse) -> Generated:
    """``resp``'s completion as this package's engine output."""
    return Generated(
        list(resp.output_tokens),
        list(resp.output_logprobs),
        list(resp.output_versions),
        resp.stop_reason,
    )


def episode_tensors(
    episode: EpisodeTokens, reward: float, turn_lens: Sequence[int] | None = None
) -> dict[str, torch.Tensor]:
    """AReaL's one-row tensor dict of ``episode``: ``[1, T]`` each, ``rewards`` ``[1]``.

    ``turn_lens`` (the token count of each policy turn, in order) adds AReaL's ``turn_ids``:
    the turn of each generated token, -1 elsewhere."""
    n = len(episode.input_ids)
    row = {
        "input_ids": torch.tensor(episode.input_ids, dtype=torch.int32),
        "loss_mask": torch.tensor(episode.loss_mask, dtype=torch.int32),
        "logprobs": torch.tensor(episode.logprobs, dtype=torch.float32),
        "versions": torch.tensor(episode.versions, dtype=torch.int32),
        "attention_mask": torch.ones(n, dtype=torch.bool),
        "rewards": torch.tensor(float(reward), dtype=torch.float32),
    }
    if turn_lens is not None:
        turns = [t for t, k in enumerate(turn_lens) for _ in range(k)]
        generated_at = iter(turns)
        ids = [next(generated_at) if m else -1 for m in episode.loss_mask]
        row["turn_ids"] = torch.tensor(ids, dtype=torch.int32)
    return {k: v.unsqueeze(0) for k, v in row.items()}
