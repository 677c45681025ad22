"""AReaL's single-turn RLVR workflow (``areal.workflow.rlvr.RLVRWorkflow`` at
areal-project/AReaL cbff54d6), in AReaL's workflow contract: one episode is one completion
of the record's prompt, scored by ``reward_fn(prompt, completions, prompt_ids,
completion_ids, **data)`` (AReaL's reward call; ``data`` is AReaL's record, so a reward
function of AReaL's signature gets its keys as AReaL gives them). The trainer runs
``gconfig.n_samples`` episodes per record (:mod:`areal_m2po.areal.trainer.episodes`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import torch

from areal_m2po.areal.api.generation import GenerationHyperparameters
from areal_m2po.areal.api.io_struct import ModelRequest
from areal_m2po.areal.api.workflow_api import RolloutWorkflow
from areal_m2po.areal.infra import workflow_context
from areal_m2po.areal.utils import stats_tracker
from areal_m2po.areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer
from areal_m2po.areal.utils.wing_paths import import_areal
from areal_m2po.areal.workflow._episode import LazyReward, episode_tensors, generated
from areal_m2po.rollout.workflows.multi_turn.episode import EpisodeTokens

__all__ = ["RLVRWorkflow", "default_data_extract_prompt_fn", "default_get_input_ids_fn"]


def default_get_input_ids_fn(data: Any, tokenizer: Any, enable_thinking: bool) -> list[int]:
    """The chat-templated token ids of ``data`` (a list of messages), generation prompt on."""
    return apply_chat_template(
        tokenizer,
        data,
        tokenize=True,
        add_generation_prompt=True,
        enable_thinking=enable_thinking,
    )


def default_data_extract_prompt_fn(data: dict[str, Any]) -> Any:
    """The record's ``messages``."""
    return data["messages"]


def _loaded(value: Any) -> Any:
    return import_areal(value) if isinstance(value, str) else value


class RLVRWorkflow(RolloutWorkflow):
    """One sampled completion of the record's prompt and its verifiable reward.

    Args:
        reward_fn: AReaL's reward signature, or its dotted path (imported at the first episode;
            ``areal.X`` paths name this wing's ``areal_m2po.areal.X``).
        gconfig: sampling; the tokenizer's pad and EOS ids are added as stop tokens.
        tokenizer: the tokenizer, or a path to load it from.
        enable_thinking: passed to the chat template.
        get_input_ids_fn: ``(prompt, tokenizer, enable_thinking) -> token ids`` (or its path).
        data_extract_prompt_fn: ``data -> prompt`` (or its path).
    """

    def __init__(
        self,
        reward_fn: Callable[..., Any] | str,
        gconfig: GenerationHyperparameters,
        tokenizer: Any,
        enable_thinking: bool = False,
        get_input_ids_fn: Callable[[Any, Any, bool], list[int]] | str = default_get_input_ids_fn,
        data_extract_prompt_fn: Callable[[dict[str, Any]], Any] | str = (
            default_data_extract_prompt_fn
        ),
    ) -> None:
        self.reward_fn = reward_fn
        self.async_reward_fn = LazyReward(reward_fn)  # a path: imported at the first episode
        self.tokenizer = load_hf_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
        self.gconfig = GenerationHyperparameters.of(gconfig).new_with_stop_and_pad_token_ids(
            self.tokenizer
        )
        self.enable_thinking = enable_thinking
        self.get_input_ids_fn = _loaded(get_input_ids_fn)
        self.data_extract_prompt_fn = _loaded(data_extract_prompt_fn)

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The episode's tensor dict, one row (see
        :mod:`areal_m2po.areal.api.workflow_api`)."""
        input_ids = list(
            self.get_input_ids_fn(
                self.data_extract_prompt_fn(data), self.tokenizer, self.enable_thinking
            )
        )
        req = ModelRequest(
            rid=uuid.uuid4().hex,
            input_ids=input_ids,
            gconfig=self.gconfig.new(n_samples=1),
            tokenizer=self.tokenizer,
        )
        resp = await engine.agenerate(req)
        reward = await self.async_reward_fn(
            self.tokenizer.decode(input_ids),
            self.tokenizer.decode(resp.output_tokens),
            resp.input_tokens,
            resp.output_tokens,
            **data,
        )
        stats_tracker.get(workflow_context.stat_scope()).scalar(reward=reward)
        episode = EpisodeTokens.from_prompt(resp.input_tokens)
        episode.append_policy(generated(resp))
        return episode_tensors(episode, float(reward))
