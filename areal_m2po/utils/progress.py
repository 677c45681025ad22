"""The step bar a trainer shows on a terminal: steps done of the run's total, the time left,
and the run's headline figures.

:class:`StepProgress` is a context manager around a trainer's loop. It draws a ``tqdm`` bar on
``stream`` only when that stream is a terminal (a log file or a pipe gets nothing from it: the
per-step metrics line stays the record there). While it is open, the package's log lines
(``areal_m2po.*``, the metrics line among them) are written above the bar
(``tqdm.contrib.logging.logging_redirect_tqdm``) instead of through it.

Headline figures (:data:`HEADLINE_FIELDS`): the training figure of the step (the RL reward, the
SFT or reward-model loss) and the last held-out figure (accuracy, perplexity), which stays on
the bar between evaluations.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any, TextIO

__all__ = ["HEADLINE_FIELDS", "StepProgress", "headline"]

HEADLINE_FIELDS = (
    ("reward/mean", "reward", "{:.3f}"),
    ("sft/loss", "loss", "{:.4f}"),
    ("train/loss", "loss", "{:.4f}"),
    ("eval/accuracy", "eval_acc", "{:.3f}"),
    ("eval/perplexity", "eval_ppl", "{:.3f}"),
)
"""``(metric key, label, format)`` of the figures the bar shows, when a run logs them."""


def headline(figures: Mapping[str, float]) -> str:
    """``label=value`` of each :data:`HEADLINE_FIELDS` key in ``figures``, comma separated."""
    return ", ".join(
        f"{label}={fmt.format(figures[key])}"
        for key, label, fmt in HEADLINE_FIELDS
        if key in figures
    )


class StepProgress:
    """A bar of ``total`` steps starting at ``initial`` (a resumed run's step) on ``stream``.

    Args:
        total: the run's number of steps.
        initial: the steps already done.
        stream: where the bar goes (``sys.stderr``); no bar unless it is a terminal.
        enabled: False: no bar at all (another process than the main one, or
            ``stats_logger.progress_bar: false``).
        figures: headline figures known before the loop (an evaluation at start).
    """

    def __init__(
        self,
        total: int,
        initial: int,
        stream: TextIO,
        enabled: bool = True,
        figures: Mapping[str, float] | None = None,
    ) -> None:
        self.total, self.initial, self.stream = total, initial, stream
        self.enabled = enabled and _is_terminal(stream)
        self.figures: dict[str, float] = dict(figures or {})
        self._bar: Any = None
        self._stack = ExitStack()

    def __enter__(self) -> StepProgress:
        if self.enabled:
            from tqdm import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = self._stack.enter_context(
                tqdm(
                    total=self.total,
                    initial=self.initial,
                    desc="train",
                    unit="step",
                    file=self.stream,
                    dynamic_ncols=True,
                    mininterval=0,  # a step takes seconds: redraw at every one
                    miniters=1,
                    postfix=headline(self.figures) or None,
                )
            )
            self._stack.enter_context(
                logging_redirect_tqdm([logging.getLogger("areal_m2po")], tqdm_class=tqdm)
            )
        return self

    def update(self, step: int, stats: Mapping[str, float]) -> None:
        """Step ``step`` is done with metrics ``stats``: move the bar and its figures."""
        self.figures.update({k: float(stats[k]) for k, _, _ in HEADLINE_FIELDS if k in stats})
        if self._bar is not None:
            self._bar.set_postfix_str(headline(self.figures), refresh=False)
            self._bar.update(step - self._bar.n)

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._bar = None


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
