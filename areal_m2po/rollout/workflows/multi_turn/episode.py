"""One multi-turn episode as an exact token sequence: policy turns and environment turns.

The sequence grows only by appending. A policy turn appends the ids the engine generated, each
with its behaviour log-prob and version, in the loss mask; an environment turn appends ids out
of the loss mask (log-prob 0, version -1). The engine is always given the whole sequence so
far, so the trajectory is exactly what it saw.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_m2po.rollout.workflows.multi_turn.chat_turns import TurnAppender
from areal_m2po.rollout.workflows.multi_turn.tool_env import Environment

__all__ = ["EpisodeTokens", "Generated", "GenerateFn", "cut_at_stop", "run_episode"]


@dataclass
class Generated:
    """One engine call's output.

    Attributes:
        ids: generated token ids, in order (the EOS that ended it included).
        logprobs: behaviour log-prob of each, [len(ids)], natural log.
        versions: the weight version that produced each, [len(ids)].
        finish_reason: ``stop`` (EOS or a stop string) or ``length``, or the engine's own word.
    """

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str


GenerateFn = Callable[[list[int], int, Sequence[str]], Awaitable[Generated]]
"""``generate(context_ids, max_new_tokens, stop_strings)`` -> :class:`Generated`."""


@dataclass
class EpisodeTokens:
    """Per-token lists of one episode, all of the same length."""

    input_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    versions: list[int]
    policy_turns: int = 0
    tool_calls: int = 0
    turn_texts: list[str] = field(default_factory=list)

    @classmethod
    def from_prompt(cls, prompt_ids: Sequence[int]) -> EpisodeTokens:
        n = len(prompt_ids)
        return cls(list(prompt_ids), [False] * n, [0.0] * n, [-1] * n)

    def append_policy(self, out: Generated) -> None:
        self.input_ids += out.ids
        self.loss_mask += [True] * len(out.ids)
        self.logprobs += [float(x) for x in out.logprobs]
        self.versions += [int(v) for v in out.versions]
        self.policy_turns += 1

    def append_environment(self, ids: Sequence[int]) -> None:
        self.input_ids += list(ids)
        self.loss_mask += [False] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)


def cut_at_stop(out: Generated, tokenizer: Any, stop: Sequence[str]) -> Generated:
    """``out`` cut after the first token at which its text contains a stop string.

    An engine that ignores per-request stop strings generates past them; a prefix of a sample
    is a sample of that prefix, so cutting keeps every kept token's log-prob and version exact.
    """
    if not stop or not out.ids:
        return out
    if not any(s in tokenizer.decode(out.ids) for s in stop):
        return out
    for k in range(1, len(out.ids) + 1):
        text = tokenizer.decode(out.ids[:k])
        if any(s in text for s in stop):
            if k == len(out.ids):
                return out
            return Generated(out.ids[:k], out.logprobs[:k], out.versions[:k], "stop")
    return out


async def run_episode(
    generate: GenerateFn,
    env: Environment,
    appender: TurnAppender,
    prompt_ids: Sequence[int],
    max_turns: int,
    max_new_tokens: int,
    max_total_tokens: int,
) -> tuple[EpisodeTokens, float]:
    """Alternate policy and environment turns until the environment ends the episode.

    Returns:
        The episode's tokens, and the undiscounted reward the environment gave. A turn cut at
        ``max_new_tokens`` is answered like any other (a verifier grades it, a tool call in it
        is answered); a context with no room left for another turn, or an aborted engine call,
        ends the episode.
    """
    tokenizer = appender.tokenizer
    episode = EpisodeTokens.from_prompt(prompt_ids)
    while True:
        budget = min(max_new_tokens, max_total_tokens - len(episode.input_ids))
        out = cut_at_stop(
            await generate(list(episode.input_ids), budget, env.stop), tokenizer, env.stop
        )
        episode.append_policy(out)
        text = tokenizer.decode([t for t in out.ids if t not in appender.eos_ids])
        episode.turn_texts.append(text)
        ended_with_eos = bool(out.ids) and out.ids[-1] in appender.eos_ids
        room = max_total_tokens - len(episode.input_ids)
        last = episode.policy_turns >= max_turns or room <= 1 or out.finish_reason == "abort"
        reply = await env.step(text, last)
        episode.tool_calls += int(reply.tool_call)
        if reply.message is None:
            return episode, reply.reward
        env_ids = appender.ids(reply.message, ended_with_eos)
        if len(env_ids) + 1 > room:  # no room for the reply and one policy token
            return episode, 0.0
        episode.append_environment(env_ids)
