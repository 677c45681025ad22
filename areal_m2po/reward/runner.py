"""Load a reward function by dotted path and run it over a batch with per-call timeouts.

Two signatures are taken (:mod:`areal_m2po.reward.signature`)::

    fn(prompt: str, completion: str, answer: str, **extra) -> float          # this trainer's
    fn(prompt, completions, prompt_ids, completion_ids, answer, **kwargs)    # AReaL's

``extra`` holds the record's other dataset columns (:func:`extra_fields`); a function that
takes no ``**kwargs`` gets only the columns it names as parameters. AReaL's gets both token-id
lists positionally and ``answer`` with the other columns as keywords, as AReaL's RLVR workflow
calls it. :func:`load_reward_fn` refuses, in one line, a function that can take neither call
or is ``async def``.

:class:`RewardRunner` calls it on a small pool of daemon worker threads.  A call that
raises, returns something that is not a finite number, or runs past ``timeout_s``
scores 0.0 and is counted in the returned stats; the first exception's traceback is logged
once (it is the user's code), later ones only counted (each distinct message once), and
:attr:`RewardRunner.last_problem` says what went wrong last, for the trainer's check that a
step did not fail on every sample.  The caller is never blocked longer than the slowest call's
own deadline.

A Python thread cannot be killed: a call that times out keeps running in the
background until it returns on its own.  The runner stops waiting for it, starts a
replacement worker so the pool keeps its capacity, and lets the stuck thread exit when
(if ever) it finishes.  Workers are daemon threads, so a hung reward function does not
keep the interpreter alive at exit.  Reward functions that may hang on I/O should use
their own timeouts, or run the work in a subprocess they can kill.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.reward.signature import RewardCall, check_reward_fn
from areal_m2po.utils.imports import load_object, split_spec

__all__ = ["RewardFn", "RewardRunner", "extra_fields", "load_reward_fn"]

logger = logging.getLogger("areal_m2po.reward")

RewardFn = Callable[..., Any]

_POLL_S = 0.05  # wake-up interval while waiting for queued calls to start
_MAX_REMEMBERED_MESSAGES = 1024


def load_reward_fn(spec: str, key: str = "reward.path") -> RewardFn:
    """Import a reward function from ``"package.module:function"`` or ``"package.module.function"``.

    Raises:
        ConfigError: (a ``ValueError``) one line naming ``key`` and ``spec`` when it is
            malformed, the module is missing or fails to import (file and line named), the
            attribute is missing, or it is not callable (see :func:`load_object`); or when the
            function is ``async def`` or can take neither reward call (see
            :func:`~areal_m2po.reward.signature.check_reward_fn`).
    """
    fn = load_object(_areal_alias(spec, key), key)
    check_reward_fn(fn, key, spec)
    return fn


def _areal_alias(spec: str, key: str) -> str:
    """``spec``, or for AReaL's own paths (``areal.reward.gsm8k.gsm8k_reward_fn``) when AReaL
    is not installed, the same path under :mod:`areal_m2po.areal`, if that module exists."""
    module, attr = split_spec(spec, key)
    if module != "areal" and not module.startswith("areal."):
        return spec
    if importlib.util.find_spec("areal") is not None:  # AReaL itself is installed
        return spec
    alias = f"areal_m2po.{module}"
    try:
        found = importlib.util.find_spec(alias) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ConfigError(
            key,
            f"{spec!r}: AReaL is not installed and areal_m2po.areal has no {module[6:]!r} "
            "(AReaL's reward functions here: areal_m2po.areal.reward.gsm8k_reward_fn, "
            "geometry3k_reward_fn)",
        )
    return f"{alias}:{attr}"


POSITIONAL_FIELDS = ("prompt_text", "answer")
"""Record fields a reward function gets as its ``prompt`` and ``answer`` arguments."""

_NOT_FIELDS = ("prompt_ids",)  # token ids are no dataset column


def extra_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments a reward function gets for ``record``: every field but the
    positional ones (``prompt_text``, ``answer``) and ``prompt_ids``; ``question`` (the prompt
    field's text) and every other dataset column included."""
    skip = (*POSITIONAL_FIELDS, *_NOT_FIELDS)
    return {k: v for k, v in record.items() if k not in skip}


@dataclass
class _Task:
    """One reward call waiting for, or running on, a worker."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: Future = field(default_factory=Future)
    started_at: float | None = None
    abandoned: bool = False


def _as_reward(value: Any) -> float | None:
    """``value`` as a finite float, or None when it is not a finite real number."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        return None
    try:
        reward = float(value)
    except (TypeError, ValueError, RuntimeError):  # e.g. a multi-element tensor
        return None
    return reward if math.isfinite(reward) else None


class RewardRunner:
    """Score batches with a reward function on worker threads, with per-call timeouts.

    Args:
        fn: ``fn(prompt, completion, answer, **extra) -> float`` or AReaL's
            ``fn(prompt, completions, prompt_ids, completion_ids, answer, **kwargs)``.
        timeout_s: seconds one call may run (measured from when it starts) before it
            scores 0.0.
        max_workers: number of calls running at once.
        name: what the log lines call the function (e.g. ``reward.path``'s value).

    Raises:
        ConfigError: ``fn`` can take neither call, or is ``async def``.
    """

    def __init__(
        self,
        fn: RewardFn,
        timeout_s: float = 10.0,
        max_workers: int = 4,
        name: str = "reward fn",
    ) -> None:
        if not callable(fn):
            raise ValueError(f"reward fn must be callable, got {type(fn).__name__}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.fn = fn
        self.call: RewardCall = check_reward_fn(fn, "reward.path", name)
        self.name = name
        self.last_problem: str | None = None  # what went wrong in the last failed call
        self._traceback_shown = False
        self.timeout_s = float(timeout_s)
        self.max_workers = int(max_workers)
        self._queue: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._n_workers = 0  # live workers that are not stuck in an abandoned call
        self._closed = False
        self._seen_messages: set[str] = set()

    # ------------------------------------------------------------------ workers
    def _spawn_worker(self) -> None:
        """Start one daemon worker (caller holds ``self._lock``)."""
        thread = threading.Thread(target=self._work, name="areal-m2po-reward", daemon=True)
        self._n_workers += 1
        thread.start()

    def _ensure_workers(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardRunner is closed")
            while self._n_workers < self.max_workers:
                self._spawn_worker()

    def _work(self) -> None:
        """Worker loop: run tasks until a shutdown sentinel or an abandoned call returns."""
        while True:
            task = self._queue.get()
            if task is None:
                return
            if not task.future.set_running_or_notify_cancel():
                continue
            with self._lock:
                task.started_at = time.monotonic()
            try:
                value = self.fn(*task.args, **task.kwargs)
            except BaseException as exc:  # noqa: BLE001 - reported as a reward error
                outcome: tuple[bool, Any] = (False, exc)
            else:
                outcome = (True, value)
            with self._lock:
                ok, payload = outcome
                if ok:
                    task.future.set_result(payload)
                else:
                    task.future.set_exception(payload)
                if task.abandoned:
                    return  # a replacement worker was started when this call timed out

    # ------------------------------------------------------------------ logging
    def _warn_once(self, message: str) -> None:
        """Log ``message`` as a warning the first time it is seen (up to a bounded number)."""
        with self._lock:
            if message in self._seen_messages:
                return
            if len(self._seen_messages) >= _MAX_REMEMBERED_MESSAGES:
                return  # enough distinct messages logged; keep memory bounded
            self._seen_messages.add(message)
        logger.warning(message)

    def _report_error(self, exc: BaseException) -> None:
        """Remember what ``exc`` says; log its traceback the first time (it is the user's code),
        later distinct messages once each."""
        detail = " ".join(str(exc).split())[:200]  # one line
        self.last_problem = f"raised {type(exc).__name__}: {detail}"
        message = f"{self.name} {self.last_problem}; scoring 0.0"
        with self._lock:
            first, self._traceback_shown = not self._traceback_shown, True
            if first:
                self._seen_messages.add(message)
        if first:
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            logger.warning(
                "%s %s; scoring 0.0 (its first traceback, shown once; every error is counted "
                "in reward/n_errors):\n%s",
                self.name,
                self.last_problem,
                trace.rstrip(),
            )
            return
        self._warn_once(message)

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        answers: Sequence[str],
        extras: Sequence[dict[str, Any]] | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        completion_ids: Sequence[Sequence[int]] | None = None,
    ) -> tuple[list[float], dict[str, float]]:
        """Reward every (prompt, completion, answer[, extra]) sample.

        ``extras[i]`` are sample ``i``'s keyword arguments (:func:`extra_fields`); those the
        function does not take (no ``**kwargs`` and no parameter of that name) are left out.
        ``prompt_ids[i]``/``completion_ids[i]`` are sample ``i``'s token ids, which an AReaL
        reward function gets (``[]`` when not given).

        Returns:
            The rewards (0.0 for failed, invalid or timed-out calls) in input order, and
            stats ``reward/n_errors``, ``reward/n_timeouts``, ``reward/n_invalid``.
        """
        n = len(prompts)
        if len(completions) != n or len(answers) != n:
            raise ValueError(
                f"score() needs equal lengths, got {n} prompts, {len(completions)} completions, "
                f"{len(answers)} answers"
            )
        for what, seq in (("extras", extras), ("prompt_ids", prompt_ids)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"score() got {len(seq)} {what} for {n} samples")
        if completion_ids is not None and len(completion_ids) != n:
            raise ValueError(f"score() got {len(completion_ids)} completion_ids for {n} samples")
        if n == 0:
            return [], {"reward/n_errors": 0.0, "reward/n_timeouts": 0.0, "reward/n_invalid": 0.0}
        self._ensure_workers()
        tasks = [
            _Task(
                *self.call.arguments(
                    prompts[i],
                    completions[i],
                    answers[i],
                    extras[i] if extras is not None else None,
                    prompt_ids[i] if prompt_ids is not None else None,
                    completion_ids[i] if completion_ids is not None else None,
                )
            )
            for i in range(n)
        ]
        for task in tasks:
            self._queue.put(task)
        timed_out = self._wait_all(tasks)
        return self._collect(tasks, timed_out)

    def _wait_all(self, tasks: list[_Task]) -> set[int]:
        """Block until every task finished or passed its deadline; return timed-out indices."""
        pending = {id(task.future): i for i, task in enumerate(tasks)}
        timed_out: set[int] = set()
        while pending:
            now = time.monotonic()
            next_deadline = now + _POLL_S
            with self._lock:
                for key, i in list(pending.items()):
                    task = tasks[i]
                    if task.future.done():
                        del pending[key]
                    elif task.started_at is not None:
                        deadline = task.started_at + self.timeout_s
                        if deadline <= now:
                            task.abandoned = True
                            timed_out.add(i)
                            del pending[key]
                            if not self._closed:
                                self._n_workers -= 1
                                self._spawn_worker()
                        else:
                            next_deadline = min(next_deadline, deadline)
            if pending:
                futures = [tasks[i].future for i in pending.values()]
                wait(
                    futures,
                    timeout=max(0.0, next_deadline - time.monotonic()),
                    return_when=FIRST_COMPLETED,
                )
        return timed_out

    def _collect(
        self, tasks: list[_Task], timed_out: set[int]
    ) -> tuple[list[float], dict[str, float]]:
        """Turn finished tasks into rewards and stats, warning once per distinct problem."""
        rewards: list[float] = []
        n_errors = n_invalid = 0
        for i, task in enumerate(tasks):
            if i in timed_out:
                rewards.append(0.0)
                continue
            exc = task.future.exception()
            if exc is not None:
                n_errors += 1
                self._report_error(exc)
                rewards.append(0.0)
                continue
            value = task.future.result()
            reward = _as_reward(value)
            if reward is None:
                n_invalid += 1
                self.last_problem = (
                    f"returned {type(value).__name__} {value!r:.80}, not a finite number"
                )
                self._warn_once(f"{self.name} {self.last_problem}; scoring 0.0")
                reward = 0.0
            rewards.append(reward)
        if timed_out:
            logger.warning(
                "%d of %d reward calls exceeded timeout_s=%g and scored 0.0 "
                "(their threads keep running; Python threads cannot be killed)",
                len(timed_out),
                len(tasks),
                self.timeout_s,
            )
        stats = {
            "reward/n_errors": float(n_errors),
            "reward/n_timeouts": float(len(timed_out)),
            "reward/n_invalid": float(n_invalid),
        }
        return rewards, stats

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Stop the idle workers; calls still running (timed out) finish in the background."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            n_workers, self._n_workers = self._n_workers, 0
        for _ in range(n_workers):
            self._queue.put(None)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
