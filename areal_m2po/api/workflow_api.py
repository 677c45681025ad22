"""The rollout-workflow interface: from one dataset record to one group of scored trajectories.

A :class:`RolloutWorkflow` is the whole rollout logic of one prompt: one **episode**
(:meth:`RolloutWorkflow.arun_episode`) asks an
:class:`~areal_m2po.api.engine_api.InferenceEngine` for completions (one turn or many, with
tools or an environment in between) and returns one :class:`Trajectory` of token-level
training data, or ``None`` to drop the prompt. The rollout executors (sync and async mode) run
``gconfig.n_samples`` episodes of each record at once, hand them to
:meth:`RolloutWorkflow.afinish_group` (scoring the group together, filtering it) and turn the
groups of a training batch into the trainer's batch tensors (layout in
:mod:`areal_m2po.utils.data`). No workflow repeats the fan-out.

One training step, from the trainer's side (what the sync executor does)::

    records, epoch = loader.next_batch()                     # B dataset records

    async def group(record):                                 # the executor's fan-out
        episodes = await asyncio.gather(*(workflow.arun_episode(engine, record)
                                          for _ in range(n)))
        if any(t is None for t in episodes):
            return None                                      # None: the group is dropped
        return await workflow.afinish_group(record, episodes)

    groups = await asyncio.gather(*(group(r) for r in records))
    kept = [g for g in groups if g is not None]
    stats = workflow.finish_batch(kept)                      # batch-level reward shaping
    batch = groups_to_batch(kept, pad_id)                    # the [B*n, T] tensors
    ... train on batch ...
    engine.update_weights_from_tensors(policy.named_tensors(), version + 1)

A workflow is named in the config by ``rollout.workflow`` (a built-in name or a dotted path
``package.module:Name``) and built as ``Name(context, **rollout.workflow_kwargs)`` with the
:class:`WorkflowContext` below.

This module imports nothing of areal_m2po but :mod:`areal_m2po.api`, so any backend or
workflow can import it.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import InferenceEngine, ModelResponse, SamplingParams

__all__ = ["RolloutWorkflow", "Trajectory", "TrajectoryGroup", "WorkflowContext"]


@dataclass
class Trajectory:
    """One training sequence: a context and the tokens the policy generated in it.

    All four per-token lists have length ``T`` (the whole sequence) and are aligned to the
    token: entry ``t`` belongs to ``input_ids[t]``.

    Args:
        input_ids: every token of the sequence: the prompt, then generated tokens; a
            multi-turn trajectory interleaves generated turns with tool/user/environment
            tokens.
        loss_mask: True on the tokens the policy generated (the ones trained on), False on
            the prompt and on any inserted (tool, user) tokens.
        logprobs: behaviour log-prob (nats) of each generated token
            (:attr:`ModelResponse.output_logprobs`); 0.0 where ``loss_mask`` is False.
        versions: policy version that generated each token
            (:attr:`ModelResponse.output_versions`); -1 where ``loss_mask`` is False.
        prompt_len: the leading tokens the batch left-pads to a common column (the tokens
            before the first generated one); ``loss_mask[:prompt_len]`` must be all False.
        reward: the sequence's scalar reward.
        no_eos: True when it was cut off (``finish_reason`` ``length`` or ``abort``) rather
            than ended by EOS, a stop token or a stop string.
        info: anything per sample the workflow wants to keep (e.g. reward parts for
            :meth:`RolloutWorkflow.finish_batch`); not logged, not put in the batch.
    """

    input_ids: list[int]
    loss_mask: list[bool]
    logprobs: list[float]
    versions: list[int]
    prompt_len: int
    reward: float = 0.0
    no_eos: bool = False
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        t = len(self.input_ids)
        lengths = (len(self.loss_mask), len(self.logprobs), len(self.versions))
        if any(n != t for n in lengths):
            raise ValueError(
                f"Trajectory: {t} input_ids but loss_mask/logprobs/versions have lengths "
                f"{lengths} (must be equal)"
            )
        if not 0 < self.prompt_len <= t:
            raise ValueError(f"Trajectory.prompt_len: {self.prompt_len} not in [1, {t}]")
        if any(self.loss_mask[: self.prompt_len]):
            raise ValueError("Trajectory: loss_mask is True inside the prompt (prompt_len)")
        if not math.isfinite(float(self.reward)):
            raise ValueError(f"Trajectory.reward: {self.reward!r} is not a finite number")

    @classmethod
    def from_response(cls, response: ModelResponse, reward: float = 0.0) -> Trajectory:
        """A single-turn trajectory: ``response.input_ids`` as the prompt, its output as the
        generated tokens."""
        p, c = len(response.input_ids), response.output_len
        return cls(
            input_ids=list(response.input_ids) + list(response.output_ids),
            loss_mask=[False] * p + [True] * c,
            logprobs=[0.0] * p + [float(x) for x in response.output_logprobs],
            versions=[-1] * p + [int(v) for v in response.output_versions],
            prompt_len=p,
            reward=reward,
            no_eos=response.finish_reason != "stop",
        )

    @property
    def n_generated(self) -> int:
        """Tokens the policy generated (True entries of ``loss_mask``)."""
        return sum(bool(m) for m in self.loss_mask)


@dataclass
class TrajectoryGroup:
    """The trajectories of one dataset record, trained on together.

    Args:
        trajectories: exactly ``gconfig.n_samples`` of them, one per episode (GRPO normalises
            rewards over a group: rows ``g * n .. g * n + n - 1`` of the batch); the executor
            refuses another count with one line naming the workflow.
        stats: metrics of this group, **summed** over the groups of a training batch and
            logged under these keys (counts, e.g. ``reward/n_errors``).
    """

    trajectories: list[Trajectory]
    stats: dict[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]


@dataclass
class WorkflowContext:
    """What the trainer gives a workflow's constructor.

    Args:
        tokenizer: the policy's Hugging Face tokenizer (decoding, chat templates).
        gconfig: the ``gconfig`` section.
        sampling: the training sampling of ``gconfig`` (:meth:`SamplingParams.from_gconfig`).
        eos_token_ids: the token ids that end a completion (tokenizer and generation config).
        reward: the reward sources the config names (``reward.path``, ``reward.model``), an
            :class:`areal_m2po.rollout.rewards.RewardSources`: ``await
            reward.ascore(records, completions)`` scores completions with every source;
            its ``finish_batch(groups)`` applies batch-level normalisation.
        max_episode_tokens: the episode budget (``rollout.max_episode_tokens`` resolved):
            no trajectory may hold more tokens, prompt and inserted tokens included; every
            engine call of an episode asks for at most what is left
            (:meth:`turn_sampling`). The trainer always sets it; None (a context built by
            hand): no budget.
    """

    tokenizer: Any
    gconfig: GenerationConfig
    sampling: SamplingParams
    eos_token_ids: list[int]
    reward: Any
    max_episode_tokens: int | None = None
    agent_config: Any = None
    """``rollout.agent`` (:class:`~areal_m2po.api.config.agent.AgentConfig`); None: defaults."""

    def turn_sampling(
        self, context_len: int, sampling: SamplingParams | None = None
    ) -> SamplingParams | None:
        """``sampling`` (default: :attr:`sampling`) for an engine call that continues an
        episode of ``context_len`` tokens: ``max_new_tokens`` (and ``min_new_tokens`` with it)
        cut to what the episode budget has left; None when not one token fits (the episode
        is over: finish reason ``length``)."""
        base = sampling if sampling is not None else self.sampling
        if self.max_episode_tokens is None:
            return base
        left = self.max_episode_tokens - context_len
        if left >= base.max_new_tokens:
            return base
        if left < 1:
            return None
        return dataclasses.replace(
            base, max_new_tokens=left, min_new_tokens=min(base.min_new_tokens, left)
        )


class RolloutWorkflow(abc.ABC):
    """The rollout of one dataset record (see the module doc)."""

    eval_metrics: tuple[str, ...] = ()
    """Names of the values :meth:`aevaluate` returns besides ``correct``; the trainer logs the
    mean of each over the held-out records as ``eval/<name>``."""

    @abc.abstractmethod
    async def arun_episode(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> Trajectory | None:
        """One episode of ``record``: its trajectory, or None to drop the record's group.

        ``record`` is one dataset row: ``question`` (prompt text), ``answer`` (reference),
        ``prompt_ids`` (the tokenised prompt, chat template applied), ``prompt_text`` (its
        text), and every other column of the dataset as it was read; treat it as read-only
        (the group's episodes share it). Many episodes run concurrently on one event loop: do
        blocking work (CPU-heavy scoring, I/O) with ``await asyncio.to_thread(...)``. An
        episode of several engine calls sends them under one ``ModelRequest.rid``, so a
        remote engine keeps them on one server. An exception stops the run (the executor
        reports it in one line); score failures that should not, catch and score.
        """

    async def afinish_group(
        self, record: dict[str, Any], trajectories: list[Trajectory]
    ) -> TrajectoryGroup | None:
        """The group of ``record`` from its ``gconfig.n_samples`` episodes (none of them
        None), or None to drop it: where the group is scored together (a reward model's batch,
        one reward-function call), filtered, and its ``stats`` counted. Default: the
        trajectories as they are, no stats."""
        return TrajectoryGroup(trajectories)

    async def aevaluate(
        self, engine: InferenceEngine, record: dict[str, Any]
    ) -> dict[str, float] | None:
        """Held-out evaluation of one record (the trainer's ``evaluator``), or None.

        None (the default): the executor evaluates the record itself, with one greedy
        completion of the prompt scored by the verifiable reward. A workflow whose episodes are
        more than one completion overrides it to run one greedy episode of ``record`` and return
        ``{"correct": 1.0 or 0.0, name: value for every name of eval_metrics}``; the trainer
        logs the mean of ``correct`` as ``eval/accuracy``.
        """
        return None

    def finish_batch(self, groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
        """Batch-level step after every episode of a training batch has finished.

        Called once per training batch on the trainer's thread, with the batch's kept groups
        (this rank's share) in order, before the batch tensors are built; in multi-process
        runs every rank calls it once per batch, so collectives are allowed. It may rewrite
        ``trajectory.reward`` from batch statistics (e.g. normalising a learned reward over
        the batch and all ranks). Returns metrics logged as they are. Default: nothing.
        """
        return {}

    def close(self) -> None:  # noqa: B027 - optional, most workflows hold nothing
        """Release what the workflow holds (a server, threads, files); the executor calls it
        once from its own ``close``, before the engine is destroyed. Default: nothing."""
