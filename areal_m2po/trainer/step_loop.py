"""The run every trainer (RL, SFT, reward model, DPO) shares: one loop, one exit.

Owns the epoch loader and a run's number of steps (:func:`epoch_loader`); the run itself
(:meth:`StepLoop.train`: resume, the run's config file and metrics sinks, the trainer's start-up
line, the evaluation at start, then the steps and the final save); what follows every training
step (:meth:`StepLoop._end_step`: evaluation and a Hugging Face save when due, then
``timing/step_s`` and the metrics line); for the trainers that resume (RL, SFT, DPO:
:class:`RecoverableStepLoop`), recover checkpoints: saving and resuming through
:class:`~areal_m2po.trainer.checkpoints.RecoverCheckpoints`, their cadence
(``recover.freq_steps``/``freq_epochs``/``freq_secs``, after good steps only) and SIGTERM (a
checkpoint after the current step, then the loop stops); and the exit status of a run
(:func:`run_trainer`). Each periodic action's cadence is a
:class:`~areal_m2po.trainer.cadence.Cadence` of its section.

A trainer subclasses one of the two classes and provides what differs: ``evaluate``,
``save_hf``, one step (``_one_step``), its start-up line (``_begin``) and, to resume,
``state_dict``/``_state_loaders``; all close through :meth:`StepLoop.close`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from areal_m2po.api.errors import ConfigError, NonFiniteTrainingError, RunError, RunStopped
from areal_m2po.trainer.cadence import Cadence
from areal_m2po.trainer.run_setup import EXIT_BAD_INPUT, build_or_report, write_run_config
from areal_m2po.utils import dist, recover
from areal_m2po.utils.console import print_error

__all__ = ["RecoverableStepLoop", "SaveFailed", "StepLoop", "epoch_loader", "run_trainer"]

logger = logging.getLogger("areal_m2po.trainer")


def epoch_loader(items: Sequence[Any], config: Any) -> tuple[Any, int]:
    """``(loader, total_steps)``: a :class:`~areal_m2po.dataset.PromptLoader` over ``items`` as
    ``config.train_dataset`` says (batch size, shuffle, drop_last; seeded with ``config.seed``)
    and the run's steps: ``total_train_epochs`` epochs, capped by ``total_train_steps``."""
    from areal_m2po.dataset import PromptLoader

    dataset = config.train_dataset
    if dataset.drop_last and dataset.batch_size > len(items):
        raise ConfigError(
            "train_dataset.batch_size",
            f"{dataset.batch_size} is more than the {len(items)} records of "
            f"train_dataset.path={dataset.path}, so no whole batch can be drawn; lower "
            "train_dataset.batch_size or add data",
        )
    loader = PromptLoader(
        list(items),
        batch_size=dataset.batch_size,
        shuffle=dataset.shuffle,
        seed=config.seed,
        drop_last=dataset.drop_last,
    )
    steps = loader.steps_per_epoch * config.total_train_epochs
    return loader, min(steps, config.total_train_steps) if config.total_train_steps else steps


class SaveFailed(RunError):
    """A save into the output folder failed (exit status 1)."""


class StepLoop:
    """What follows each step of a trainer's loop.

    The trainer sets ``config`` (a root config with ``evaluator`` and ``saver`` sections),
    ``step`` (finished steps), ``total_steps``, ``stats_logger``, ``accelerator`` and, for the
    helpers that use them, ``loader``, ``output_dir``, ``is_main`` and ``tokenizer``; it defines
    :meth:`evaluate`, :meth:`save_hf`, :meth:`_one_step` and :meth:`_begin`.
    """

    config: Any
    step: int
    total_steps: int
    stats_logger: Any
    accelerator: Any
    loader: Any
    output_dir: str
    is_main: bool
    tokenizer: Any
    stop_requested: bool = False
    step_skipped: bool = False
    skip_streaks: dict[str, int] | None = None
    """Per trained section (``model``, ``actor``, ``critic``): the steps in a row whose
    update was skipped for a non-finite loss or gradient (:meth:`_count_skipped_steps`)."""
    _skip_hint: str = ""

    def evaluate(self) -> dict[str, float]:
        """The held-out metrics (``eval/*``)."""
        raise NotImplementedError

    def save_hf(self, tag: str) -> str:
        """Save the model in Hugging Face format under ``checkpoints/<tag>``; its path."""
        raise NotImplementedError

    def _one_step(self) -> dict[str, float]:
        """Train step ``self.step + 1`` (not yet counted); its metrics."""
        raise NotImplementedError

    def _begin(self) -> None:
        """What the trainer does once its metrics sinks are open, before any evaluation: its
        start-up line (and the RL trainer's rollout start)."""
        raise NotImplementedError

    def _before_loop(self) -> None:
        """After the evaluation at start, before the first step (the RL trainer's prefill)."""

    def _has_eval_data(self) -> bool:
        """Whether :meth:`evaluate` has anything to score (the evaluation at start)."""
        return True

    def _step_counted(self, stats: dict[str, float]) -> None:
        """Step ``self.step`` was just counted, before its evaluation and metrics line."""

    def _after_step(self, stats: dict[str, float]) -> bool:
        """After a logged step; True: stop now (default: never)."""
        del stats
        return False

    def resume(self) -> bool:
        """Load a recover checkpoint; True when one was loaded (none here)."""
        return False

    def train(self) -> None:
        """The run: resume (if the trainer can), write ``config.yaml``, open the metrics sinks
        (keeping the steps up to a resumed checkpoint's), :meth:`_begin`, the evaluation at
        start (``evaluator.eval_at_start``, step 0), :meth:`_before_loop`, then the steps under
        the step bar: each :meth:`_one_step`, counted, ended by :meth:`_end_step` (which may
        raise :class:`~areal_m2po.api.errors.NonFiniteTrainingError`) and :meth:`_after_step`
        (True stops the loop); then :meth:`_save_final`."""
        self._start_cadences()
        resumed = self.resume()
        write_run_config(self.config, self)
        # metrics.jsonl keeps the steps up to the checkpoint's (all of them dropped when fresh)
        self.stats_logger.start(resume_step=self.step + 1 if resumed else 0)
        self._begin()
        if self.config.evaluator.eval_at_start and self.step == 0 and self._has_eval_data():
            self.stats_logger.log(0, self.evaluate())
        self._before_loop()
        with self.stats_logger.progress(self.total_steps, self.step):
            while self.step < self.total_steps:
                t0 = time.perf_counter()
                stats = self._one_step()
                self.step += 1
                self._step_counted(stats)
                self._end_step(stats, t0)
                if self._after_step(stats):
                    break
        self._save_final()

    def failure_status(self, exc: Exception) -> int | None:
        """The exit status for an error :meth:`train` raised that is no ``RunError``, after
        reporting it (None: not handled here, it propagates)."""
        del exc
        return None

    def close(self) -> None:
        """The shutdown every trainer ends with: the loggers, the accelerator's references,
        then the process group (:func:`~areal_m2po.utils.dist.end_process_group`, while the
        interpreter is whole: gloo work can abort its exit), and the output folder's lock."""
        self.stats_logger.close()
        self.accelerator.free_memory()
        dist.end_process_group()
        lock = getattr(self, "run_lock", None)
        if lock is not None:  # the output folder is free for the next run
            lock.release()

    def _cadence(self, name: str) -> Cadence:
        """The cadence of config section ``name`` (evaluator, saver, recover), started on first
        use (:meth:`_start_cadences` starts them all when the loop begins)."""
        cadences: dict[str, Cadence] = self.__dict__.setdefault("_cadences", {})
        if name not in cadences:
            cadences[name] = Cadence(getattr(self.config, name))
        return cadences[name]

    def _start_cadences(self) -> None:
        """Start the time frequencies of evaluation, saves and recover checkpoints now."""
        for name in ("evaluator", "saver", "recover"):
            if hasattr(self.config, name):
                self._cadence(name).ran()

    def _due(self, name: str) -> bool:
        """Whether section ``name``'s action is due after step ``self.step``, the same answer
        on every process (the time frequency is decided together)."""
        cadence = self._cadence(name)
        steps_per_epoch = int(getattr(self.loader, "steps_per_epoch", 0) or 0)
        if cadence.due_by_count(self.step, steps_per_epoch):
            return True
        if cadence.freq_secs is None:
            return False
        by_time = cadence.due_by_time()
        if dist.is_distributed():
            by_time = bool(dist.all_reduce_max(torch.tensor([float(by_time)]))[0] > 0)
        return by_time

    def _skip_sections(self) -> list[tuple[str, int | None, Callable[[dict[str, float]], bool]]]:
        """``(section, limit, skipped)`` of every trained section: its config key, its
        ``max_consecutive_skipped_steps`` and whether a step's stats say its update was
        skipped. Default: the ``model`` section, skipped when any ``*/skipped`` stat is
        positive (the supervised trainers)."""

        def skipped(stats: dict[str, float]) -> bool:
            return any(v > 0 for k, v in stats.items() if k.endswith("/skipped"))

        return [("model", self.config.model.max_consecutive_skipped_steps, skipped)]

    def _count_skipped_steps(self, stats: dict[str, float]) -> NonFiniteTrainingError | None:
        """Count step ``self.step``'s skipped updates (``self.step_skipped``: whether any
        was); the error to stop with when a section's update was skipped
        ``max_consecutive_skipped_steps`` times in a row."""
        if self.skip_streaks is None:
            self.skip_streaks = {}
        self.step_skipped = False
        for section, limit, skipped in self._skip_sections():
            is_skipped = skipped(stats)
            self.step_skipped |= is_skipped
            streak = self.skip_streaks.get(section, 0) + 1 if is_skipped else 0
            self.skip_streaks[section] = streak
            if limit is not None and streak >= limit:
                last = recover.latest_checkpoint(recover.recover_root(self.output_dir))
                where = (
                    f"The last good recover checkpoint is {last}"
                    if last
                    else ("There is no recover checkpoint")
                )
                return NonFiniteTrainingError(
                    f"the last {streak} training steps (up to step {self.step}) were skipped "
                    f"for a non-finite loss or gradient ({section}.max_consecutive_skipped_"
                    f"steps={limit}); stopping. {where}. Lower {section}.optimizer.lr"
                    f"{self._skip_hint}, then rerun (recover.mode=auto resumes from a "
                    "checkpoint)."
                )
        return None

    def _end_step(self, stats: dict[str, float], t_start: float) -> None:
        """After step ``self.step`` (already counted): evaluation when due (the evaluator's
        cadence, and after the last step with ``eval_at_end``), an HF save when the saver's
        cadence says so, then ``stats["timing/step_s"]`` (wall seconds since ``t_start``, a
        ``time.perf_counter`` value) and the step's metrics line.

        Raises:
            NonFiniteTrainingError: after the metrics line (and without evaluating or saving)
                when this step makes too many skipped steps in a row
                (:meth:`_count_skipped_steps`).
        """
        cfg = self.config
        stop = self._count_skipped_steps(stats)
        last = self.step == self.total_steps
        if stop is None and (self._due("evaluator") or (last and cfg.evaluator.eval_at_end)):
            stats.update(self.evaluate())
            self._cadence("evaluator").ran()
        failed = None
        if stop is None and self._due("saver"):
            try:
                self.saved("saver", lambda: self.save_hf(f"step_{self.step}"))
                self._cadence("saver").ran()
            except SaveFailed as exc:  # the step's metrics line is written first
                failed = exc
        stats["timing/step_s"] = time.perf_counter() - t_start
        self.stats_logger.log(self.step, stats)
        if stop is not None:
            raise stop
        if failed is not None:
            raise failed

    def _save_final(self) -> None:
        """The ``final`` HF save after the loop (``saver.save_at_end``; not after SIGTERM)."""
        if self.config.saver.save_at_end and not self.stop_requested:
            self.saved("saver", lambda: self.save_hf("final"))

    def saved(self, what: str, save: Callable[[], str]) -> str:
        """``save()`` (a save into the output folder; its path), a failed write (a full
        disk, a folder gone or read-only) turned into one line naming the ``what`` section.

        Raises:
            SaveFailed: exit status 1; the metrics and the checkpoints written before stay.
        """
        try:
            return save()
        except OSError as exc:
            where = f" {exc.filename}" if exc.filename else ""
            raise SaveFailed(
                f"{what}: a save into {self.output_dir} failed ({type(exc).__name__}:{where} "
                f"{exc.strerror or exc}); metrics.jsonl and the checkpoints written before "
                "are kept"
            ) from exc

    def _save_engine_hf(self, engine: Any, tag: str, what: str) -> str:
        """``engine.save_hf`` with the trainer's ``tokenizer`` into
        ``<output_dir>/checkpoints/<tag>`` (rank 0 logs it as ``what``); the path."""
        path = os.path.join(self.output_dir, "checkpoints", tag)
        engine.save_hf(path, self.tokenizer)
        if self.is_main:
            logger.info("saved %s (HF format) to %s", what, path)
        return path


class RecoverableStepLoop(StepLoop):
    """A :class:`StepLoop` that writes recover checkpoints, resumes from them and stops
    cleanly on SIGTERM.

    The trainer also sets ``checkpoints`` (a
    :class:`~areal_m2po.trainer.checkpoints.RecoverCheckpoints`) and defines
    ``state_dict(shard_dir)`` and ``_state_loaders(shard_dir)``; :meth:`StepLoop.train` calls
    :meth:`resume` first and :meth:`_checkpoint_after_step` after each logged step.
    """

    checkpoints: Any
    _last_recover_step: int = -1

    def state_dict(self, shard_dir: str | None = None) -> dict[str, Any]:
        """This rank's state, one entry per checkpoint part."""
        raise NotImplementedError

    def _state_loaders(self, shard_dir: str | None) -> list[tuple[str, Callable[[Any], None]]]:
        """``(part, load)`` of every part of :meth:`state_dict`, in load order."""
        raise NotImplementedError

    def save_checkpoint(self) -> str:
        """Write a recover checkpoint after ``self.step`` (every rank calls it). Its path."""
        return self.saved(
            "recover",
            lambda: self.checkpoints.save(self.step, lambda shard_dir: self.state_dict(shard_dir)),
        )

    def resume(self) -> bool:
        """Load the recover checkpoint ``recover.mode`` asks for; True when one was loaded.

        Raises:
            RecoverError: none for ``recover.mode=resume``, or one that does not match this run.
        """
        path = self.checkpoints.to_resume()
        if path is not None:
            self.checkpoints.load(path, self._state_loaders(path))
        return path is not None

    def train(self) -> None:
        """Run the loop with SIGTERM turned into a checkpoint after the current step.

        Raises:
            RunStopped: after that checkpoint (the run is not finished: exit status 143).
        """
        restore_handler = recover.install_sigterm_handler(self._on_sigterm)
        try:
            super().train()
        finally:
            restore_handler()
        if self.stop_requested:
            raise RunStopped(
                f"stopped by SIGTERM after step {self.step} of {self.total_steps}; its recover "
                f"checkpoint is in {recover.recover_root(self.output_dir)}: rerun with "
                "recover.mode=auto to continue"
            )

    def _on_sigterm(self) -> None:
        self.stop_requested = True
        logger.warning("SIGTERM: saving a recover checkpoint after this step, then exiting")

    def _after_step(self, stats: dict[str, float]) -> bool:
        """A recover checkpoint after a logged step (not after a skipped update, counted by
        :meth:`_end_step`); True: stop (SIGTERM)."""
        del stats
        return self._checkpoint_after_step(good=not self.step_skipped)

    def _checkpoint_after_step(self, good: bool) -> bool:
        """A recover checkpoint after step ``self.step`` when one is due (the recover
        section's cadence, after a ``good`` step only, unless ``recover.mode`` is disabled) or
        SIGTERM reached any rank; True: stop now (SIGTERM)."""
        cfg = self.config
        stop = self.stop_requested
        if dist.is_distributed():  # a signal may reach only some ranks
            stop = bool(dist.all_reduce_max(torch.tensor([float(stop)]))[0] > 0)
        self.stop_requested = stop  # every rank: no final save, the same exit status
        periodic = cfg.recover.mode != "disabled" and self._due("recover") and good
        if (periodic or stop) and self._last_recover_step != self.step:
            self.save_checkpoint()
            self._last_recover_step = self.step
            self._cadence("recover").ran()
        if stop:
            logger.warning("stopped by SIGTERM after step %d; checkpoint saved", self.step)
        return stop


def run_trainer(build: Callable[[Any], StepLoop], config: Any) -> int:
    """Build a trainer from ``config`` and run it; the exit status: 0 done, 2 bad input found
    while building (one ``error:`` line), a :class:`~areal_m2po.api.errors.RunError`'s own
    (1: a recover checkpoint that does not match, a run of non-finite steps; 143: stopped by
    SIGTERM after a recover checkpoint), or what the trainer's :meth:`StepLoop.failure_status`
    makes of another error. The trainer closes in every case."""
    trainer = build_or_report(build, config)
    if trainer is None:
        return EXIT_BAD_INPUT
    try:
        trainer.train()
    except RunError as exc:
        print_error(exc)
        return exc.exit_status
    except Exception as exc:
        status = trainer.failure_status(exc)
        if status is None:
            raise
        return status
    finally:
        trainer.close()
    return 0
