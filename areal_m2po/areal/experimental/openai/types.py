"""AReaL's record of one chat completion (``areal.experimental.openai.types`` at
areal-project/AReaL cbff54d6): the completion, the engine's tokens behind it, its reward, and
(``chat_template_type="concat"``) the earlier completion whose tokens its prompt extends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from areal_m2po.areal.api.io_struct import ModelResponse
from areal_m2po.areal.workflow._episode import episode_tensors, generated
from areal_m2po.rollout.workflows.multi_turn.episode import EpisodeTokens

__all__ = ["InteractionWithTokenLogpReward"]


@dataclass
class InteractionWithTokenLogpReward:
    """One completion (``completion``, an OpenAI ``ChatCompletion``) with its
    ``model_response`` and ``reward``; ``messages`` its request, ``output_message_list`` its
    reply as a message (None while it is being generated)."""

    model_response: ModelResponse | None = None
    reward: float | None = None
    original_reward: float | None = None
    parent: InteractionWithTokenLogpReward | None = None
    chat_template_type: str = "hf"
    messages: list[dict[str, Any]] = field(default_factory=list)
    output_message_list: list[dict[str, Any]] | None = None
    completion: Any = None
    _cache: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def interaction_id(self) -> str | None:
        return None if self.completion is None else self.completion.id

    @property
    def created_at(self) -> float | None:
        return None if self.completion is None else float(self.completion.created)

    def _chain(self) -> list[InteractionWithTokenLogpReward]:
        """This completion and (``concat``) the earlier ones its prompt extends, oldest first;
        a prompt that does not extend its parent's tokens starts the chain (AReaL masks the
        parent out)."""
        chain = [self]
        while self.chat_template_type == "concat" and chain[0].parent is not None:
            parent, child = chain[0].parent, chain[0].model_response
            assert parent.model_response is not None and child is not None
            held = parent.model_response.input_tokens + parent.model_response.output_tokens
            if child.input_tokens[: len(held)] != held or child.input_len <= len(held):
                break
            chain.insert(0, parent)
        return chain

    def to_tensor_dict(self) -> dict[str, torch.Tensor]:
        """AReaL's one-row tensor dict (``[1, T]``; ``rewards`` and ``original_rewards``
        ``[1]``): the prompt (and between ``concat`` turns, the new messages) out of the loss
        mask, every completion of the chain in it, with ``turn_ids``."""
        if self._cache is not None:
            return self._cache
        chain = self._chain()
        responses = [node.model_response for node in chain]
        assert all(r is not None for r in responses), "Model response is not set."
        first = responses[0]
        episode = EpisodeTokens.from_prompt(first.input_tokens)  # type: ignore[union-attr]
        for resp in responses:
            assert resp is not None
            episode.append_environment(resp.input_tokens[len(episode.input_ids) :])
            episode.append_policy(generated(resp))
        reward = self.reward if self.reward is not None else 0.0
        original = self.original_reward if self.original_reward is not None else reward
        row = episode_tensors(episode, reward, [r.output_len for r in responses])  # type: ignore[union-attr]
        row["original_rewards"] = torch.tensor([float(original)])
        self._cache = row
        return row
