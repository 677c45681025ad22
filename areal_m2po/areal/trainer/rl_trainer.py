"""AReaL's ``PPOTrainer`` (``areal.trainer.rl_trainer`` at areal-project/AReaL cbff54d6) over
this package's RL trainer (:class:`areal_m2po.trainer.rl_trainer.RLTrainer`): everything the
config turns on (M2PO, the decoupled loss, staleness, async rollout, ...) works as with
``python -m areal_m2po.train``.

::

    with PPOTrainer(config, train_dataset=train, valid_dataset=valid) as trainer:
        trainer.train(workflow="areal.workflow.rlvr.RLVRWorkflow", workflow_kwargs={...})

``workflow`` (and ``eval_workflow``) is an AReaL ``RolloutWorkflow`` instance, class or dotted
path (``areal.X`` paths name this wing's ``areal_m2po.areal.X``), run through
:class:`~areal_m2po.areal.trainer.episodes.ArealEpisodes`; or an agent with ``async def
run(data, **extra_kwargs)`` (instance, class or path), run by this package's agent workflow
against its OpenAI-compatible endpoint. The records are the data set's rows; the prompt the
trainer records for each (its length budget, the plain evaluation) is the chat template of
its ``messages`` (or its ``question``/``prompt``/``query`` text).

Differences from AReaL, by design: the models load in :meth:`PPOTrainer.train` (the workflow
is known then), not in the constructor; a group with a dropped episode is dropped whole
(AReaL keeps the rest unless ``drop_incomplete_group``); training stops with the trainer's own
exit status (``SystemExit``) on bad input found while building the run.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from areal_m2po.api.cli_args import PPOConfig as _PackagePPOConfig
from areal_m2po.api.workflow_api import RolloutWorkflow as _PackageWorkflow
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.areal.api.workflow_api import RolloutWorkflow
from areal_m2po.areal.trainer.episodes import AREAL_DATA, ArealEpisodes
from areal_m2po.areal.utils.hf_utils import apply_chat_template, load_hf_tokenizer
from areal_m2po.areal.utils.wing_paths import import_areal

__all__ = ["PPOTrainer", "load_workflow", "to_records"]

logger = logging.getLogger("areal_m2po.areal")

WorkflowFactory = Callable[[WorkflowContext], _PackageWorkflow]


def load_workflow(spec: Any, kwargs: dict[str, Any] | None, key: str) -> Any:
    """The AReaL workflow or agent object ``spec`` names: an instance as it is, a class built
    with ``kwargs``, a dotted path imported first.

    Raises:
        ValueError: one line naming ``key``: the path does not import, or a workflow class
            without ``kwargs``.
    """
    if isinstance(spec, str):
        try:
            spec = import_areal(spec)
        except (ValueError, ImportError, AttributeError) as exc:
            raise ValueError(f"{key}: {spec!r} does not import: {exc}") from None
    if isinstance(spec, type):
        if issubclass(spec, RolloutWorkflow) and kwargs is None:
            raise ValueError(f"{key}: {spec.__name__} is a class; give its {key}_kwargs")
        return spec(**(kwargs or {}))
    if kwargs is not None:
        logger.warning("%s_kwargs ignored: %s is already an instance", key, type(spec).__name__)
    return spec


def _prompt(row: dict[str, Any], tokenizer: Any) -> tuple[str, list[int], str]:
    """``(question, prompt_ids, prompt_text)`` of an AReaL row."""
    messages = row.get("messages")
    if isinstance(messages, list) and messages:
        ids = apply_chat_template(tokenizer, messages, tokenize=True, add_generation_prompt=True)
        text = apply_chat_template(tokenizer, messages, tokenize=False, add_generation_prompt=True)
        users = [m.get("content") for m in messages if m.get("role") == "user"]
        return str(users[-1] if users else messages[-1].get("content")), list(ids), text
    for name in ("question", "prompt", "query"):
        if isinstance(row.get(name), str):
            text = row[name]
            return text, list(tokenizer(text)["input_ids"]), text
    raise ValueError(
        f"a record has neither messages nor a question/prompt text: keys {sorted(row)}"
    )


def to_records(rows: Iterable[dict[str, Any]] | None, tokenizer: Any) -> list[dict[str, Any]]:
    """This trainer's records of AReaL rows: the row's keys, ``question``/``answer``/
    ``prompt_ids``/``prompt_text`` for the trainer, and the row itself under ``areal_data``
    (what an AReaL workflow gets, so a row's own ``prompt_ids`` reaches it unchanged)."""
    out = []
    for row in rows or ():
        row = dict(row)
        question, ids, text = _prompt(row, tokenizer)
        extra = {"question": question, "prompt_ids": ids, "prompt_text": text}
        out.append({**row, "answer": row.get("answer", ""), **extra, AREAL_DATA: row})
    return out


class _WithEvaluation(_PackageWorkflow):
    """``train``'s episodes and ``evaluate``'s evaluation (two agents of AReaL's ``train``)."""

    def __init__(self, train: _PackageWorkflow, evaluate: _PackageWorkflow) -> None:
        self.train, self.evaluate = train, evaluate
        self.eval_metrics = evaluate.eval_metrics
        self.name = getattr(train, "name", type(train).__name__)

    async def arun_episode(self, engine: Any, record: dict[str, Any]) -> Any:
        return await self.train.arun_episode(engine, record)

    async def afinish_group(self, record: dict[str, Any], trajectories: list[Any]) -> Any:
        return await self.train.afinish_group(record, trajectories)

    def finish_batch(self, groups: Any) -> dict[str, float]:
        return self.train.finish_batch(groups)

    async def aevaluate(self, engine: Any, record: dict[str, Any]) -> dict[str, float] | None:
        return await self.evaluate.aevaluate(engine, record)

    def close(self) -> None:
        self.train.close()
        self.evaluate.close()


class PPOTrainer:
    """AReaL's RL trainer (see the module doc).

    Args:
        config: a config of :func:`~areal_m2po.areal.api.expr_config.load_expr_config`
            (this package's PPO config, or AReaL's ``GRPOConfig`` and subclasses).
        train_dataset: the training rows (a :class:`datasets.Dataset` or a list of dicts).
        valid_dataset: the held-out rows, or None.
    """

    def __init__(self, config: Any, train_dataset: Any = None, valid_dataset: Any = None) -> None:
        if not isinstance(config, _PackagePPOConfig):
            raise TypeError(
                f"PPOTrainer: config is a {type(config).__name__}; load it with "
                "load_expr_config(argv, GRPOConfig)"
            )
        if train_dataset is None:
            raise ValueError(
                "PPOTrainer: train_dataset is required (AReaL's online agent mode, which has "
                "none, is out of scope)"
            )
        self.config = config
        self.tokenizer = load_hf_tokenizer(config.tokenizer_path or config.actor.path)
        self.train_dataset, self.valid_dataset = train_dataset, valid_dataset
        self.status: int | None = None

    def _factory(
        self, workflow: Any, eval_workflow: Any, dynamic_filter_fn: Any
    ) -> WorkflowFactory:
        if isinstance(workflow, RolloutWorkflow):
            if eval_workflow is not None and not isinstance(eval_workflow, RolloutWorkflow):
                raise ValueError("eval_workflow: an agent evaluates only beside an agent workflow")
            return lambda ctx: ArealEpisodes(ctx, workflow, eval_workflow, dynamic_filter_fn)
        if callable(getattr(workflow, "run", None)):
            from areal_m2po.rollout.workflows.agent.workflow import AgentWorkflow

            if dynamic_filter_fn is not None:
                raise ValueError("dynamic_filter_fn: not supported with an agent workflow here")
            if eval_workflow is not None and not callable(getattr(eval_workflow, "run", None)):
                raise ValueError("eval_workflow: an agent workflow evaluates with an agent")

            def build(ctx: WorkflowContext) -> _PackageWorkflow:
                train = AgentWorkflow(ctx, agent=workflow)
                if eval_workflow is None or eval_workflow is workflow:
                    return train
                return _WithEvaluation(train, AgentWorkflow(ctx, agent=eval_workflow))

            return build
        raise ValueError(
            f"workflow: a {type(workflow).__name__} is neither an AReaL RolloutWorkflow nor an "
            "agent with async run(data, **extra_kwargs)"
        )

    def train(
        self,
        workflow: Any = None,
        eval_workflow: Any = None,
        workflow_kwargs: dict[str, Any] | None = None,
        eval_workflow_kwargs: dict[str, Any] | None = None,
        dynamic_filter_fn: Callable[[dict[str, Any]], bool] | str | None = None,
        total_epochs: int | None = None,
    ) -> None:
        """Train ``total_epochs`` epochs (default ``config.total_train_epochs``) with
        ``workflow``; evaluate with ``eval_workflow`` when the evaluator is due (without an
        ``eval_workflow`` or a ``valid_dataset``, never: AReaL's rule).

        Raises:
            ValueError: one line for a missing or unloadable workflow, or a non-positive
                ``total_epochs``.
            SystemExit: the run stopped with the trainer's non-zero exit status.
        """
        from areal_m2po.trainer.rl_trainer import RLTrainer
        from areal_m2po.trainer.step_loop import run_trainer

        if workflow is None:
            raise ValueError(
                "workflow: required (AReaL's online agent mode, config-driven, is out of scope)"
            )
        cfg = self.config
        if total_epochs is not None:
            if not (isinstance(total_epochs, int) and total_epochs > 0):
                raise ValueError(f"Total epochs must be positive: {total_epochs}")
            cfg = dataclasses.replace(cfg, total_train_epochs=total_epochs)
        if self.valid_dataset is None or eval_workflow is None:  # AReaL: no evaluation then
            off = {"freq_steps": None, "freq_epochs": None, "freq_secs": None}
            evaluator = dataclasses.replace(
                cfg.evaluator, eval_at_start=False, eval_at_end=False, **off
            )
            cfg = dataclasses.replace(cfg, evaluator=evaluator)
        wf = load_workflow(workflow, workflow_kwargs, "workflow")
        eval_wf = None
        if eval_workflow is not None:
            eval_wf = load_workflow(eval_workflow, eval_workflow_kwargs, "eval_workflow")
        if isinstance(dynamic_filter_fn, str):
            dynamic_filter_fn = import_areal(dynamic_filter_fn)
        factory = self._factory(wf, eval_wf, dynamic_filter_fn)
        prompts = (
            to_records(self.train_dataset, self.tokenizer),
            to_records(self.valid_dataset, self.tokenizer),
        )
        self.status = run_trainer(lambda c: RLTrainer(c, prompts=prompts, workflow=factory), cfg)
        if self.status != 0:
            raise SystemExit(self.status)

    def close(self) -> None:
        """Nothing to release: the run closed its models when :meth:`train` returned."""

    def __enter__(self) -> PPOTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
