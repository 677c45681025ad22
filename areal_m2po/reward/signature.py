"""Which of the two reward-function signatures a function has, and the arguments of one call.

Two signatures are taken:

* this trainer's, ``fn(prompt, completion, answer, **fields) -> float``;
* AReaL's (``areal/reward/gsm8k.py`` and every AReaL example's reward function at
  areal-project/AReaL cbff54d6), ``fn(prompt, completions, prompt_ids, completion_ids,
  answer, **kwargs) -> float``: AReaL's RLVR workflow calls it as ``fn(prompt_text,
  completion_text, prompt_token_ids, completion_token_ids, **record)``, so ``answer`` and the
  record's other fields come as keyword arguments.

A function is taken for AReaL's when one of its first four positional parameters carries one
of AReaL's names (``completions``, ``prompt_ids``, ``completion_ids``) or its ``answer``
parameter comes fourth or later (this trainer's has it third); otherwise for this trainer's
(its fourth and later parameters are filled from the record's fields by name). :func:`check_reward_fn` decides once, when
``reward.path`` loads, and refuses a function neither call can bind (``def f(prompt,
completion)``) and an ``async def`` one: AReaL runs reward functions synchronously in a
process pool (its ``AsyncRewardWrapper``), so it takes no coroutine function either.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from areal_m2po.api.cli_args import ConfigError

__all__ = ["AREAL", "OURS", "RewardCall", "check_reward_fn"]

OURS = "areal_m2po"
"""Style of ``fn(prompt, completion, answer, **fields)``."""
AREAL = "areal"
"""Style of AReaL's ``fn(prompt, completions, prompt_ids, completion_ids, answer, **kwargs)``."""

_AREAL_NAMES = frozenset({"completions", "prompt_ids", "completion_ids"})
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_SIGNATURES = (
    "AReaL's (prompt, completions, prompt_ids, completion_ids, answer, **kwargs) or this "
    "trainer's (prompt, completion, answer, **fields)"
)


@dataclass(frozen=True)
class RewardCall:
    """How to call one reward function.

    Attributes:
        style: :data:`OURS` or :data:`AREAL`.
        n_positional: positional arguments the call passes (3 or 4).
        keywords: names it takes by keyword beyond those (None: any, it has ``**kwargs`` or
            no readable signature).
    """

    style: str
    n_positional: int
    keywords: frozenset[str] | None

    def arguments(
        self,
        prompt: str,
        completion: str,
        answer: Any,
        extra: Mapping[str, Any] | None = None,
        prompt_ids: Sequence[int] | None = None,
        completion_ids: Sequence[int] | None = None,
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of the call for one sample; ``extra`` are the record's other
        fields (:func:`~areal_m2po.reward.runner.extra_fields`); missing token ids are ``[]``."""
        extra = dict(extra or {})
        if self.style == AREAL:
            args: tuple[Any, ...] = (
                prompt,
                completion,
                list(prompt_ids or []),
                list(completion_ids or []),
            )
            kwargs = {"answer": answer, **extra}
        else:
            args, kwargs = (prompt, completion, answer), extra
        if self.keywords is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.keywords}
        return args, kwargs


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine or async generator (functions, partials and
    objects whose ``__call__`` is ``async def``)."""
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    call = getattr(target, "__call__", None)  # noqa: B004 - an object's own __call__
    return any(
        inspect.iscoroutinefunction(t) or inspect.isasyncgenfunction(t)
        for t in (target, call)
        if t is not None
    )


def _describe(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return str(name)


def _call_for(params: list[inspect.Parameter]) -> RewardCall | None:
    """The call ``params`` can take, or None."""
    positional = [p for p in params if p.kind in _POSITIONAL]
    var_pos = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    names = [p.name for p in positional]
    # AReaL's names among the first four, or ``answer`` where AReaL has it (ours: third)
    areal = bool(set(names[:4]) & _AREAL_NAMES) or "answer" in names[3:]
    n_pos = 4 if areal else 3
    if len(positional) < n_pos and not var_pos:
        return None
    if any(
        p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is inspect.Parameter.empty
        for p in positional[n_pos:]
    ):
        return None  # a required positional-only parameter no keyword can fill
    kw_only = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    keywords = None
    if not var_kw:
        keywords = frozenset(p.name for p in positional[n_pos:] + kw_only if p.kind in _NAMED)
    return RewardCall(AREAL if areal else OURS, n_pos, keywords)


def check_reward_fn(fn: Any, key: str = "reward.path", spec: str | None = None) -> RewardCall:
    """How to call the reward function ``fn``; refuses one no reward call can work with.

    Args:
        fn: the loaded object.
        key: the config key that named it (in the error).
        spec: the key's value (in the error; default: the function's name).

    Raises:
        ConfigError: one line naming ``key`` when ``fn`` is not callable, is ``async def``, or
            its signature takes neither reward call.
    """
    where = f"{spec!r}: " if spec else ""
    if not callable(fn):
        raise ConfigError(key, f"{where}{type(fn).__name__} object is not callable")
    if _is_async(fn):
        raise ConfigError(
            key,
            f"{where}{_describe(fn)} is an async function; reward functions are called "
            "synchronously in worker threads (AReaL too runs them synchronously, in a process "
            "pool): define it with plain 'def'",
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no readable signature (a builtin): ours, every keyword
        return RewardCall(OURS, 3, None)
    call = _call_for(params)
    if call is None:
        raise ConfigError(
            key, f"{where}{_describe(fn)} cannot take a reward call: it must take {_SIGNATURES}"
        )
    return call
