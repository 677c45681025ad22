"""The step bar: drawn on a terminal only, steps of the run's total from a resumed step, time
left, the headline figures (the last held-out one kept between evaluations), log lines above it.
(Every trainer showing it on a real terminal: ``tests/integration/test_progress_bar.py``.)"""

from __future__ import annotations

import io
import logging
import sys

from areal_m2po.utils.progress import StepProgress, headline


class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _screens(text: str) -> list[str]:
    """What the terminal showed after each carriage return or newline, non-empty."""
    return [s.strip() for s in text.replace("\r", "\n").split("\n") if s.strip()]


def test_the_bar_counts_steps_and_shows_the_headline_figures():
    term = Terminal()
    with StepProgress(4, 1, term, figures={"eval/accuracy": 0.25}) as bar:
        bar.update(2, {"reward/mean": 0.5, "actor/loss": 1.0})
        bar.update(3, {"reward/mean": 0.625, "eval/accuracy": 0.375})
        bar.update(4, {"reward/mean": 0.75})
    screens = _screens(term.getvalue())
    assert screens[0].startswith("train:  25%") and "1/4" in screens[0]
    assert "eval_acc=0.250" in screens[0]  # known before the loop (an evaluation at start)
    last = screens[-1]
    assert last.startswith("train: 100%") and "4/4" in last
    # time spent < time left, rate, then the figures; the last evaluation stays on the bar
    assert "<00:00" in last and "step" in last
    assert last.endswith("reward=0.750, eval_acc=0.375]")
    assert "loss" not in last  # actor/loss is no headline figure


def test_log_lines_go_above_the_bar_and_nothing_is_drawn_off_a_terminal(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)  # the package logs to stderr, the bar goes there
    log = logging.getLogger("areal_m2po.test_progress")
    handler = logging.StreamHandler(sys.stderr)
    root = logging.getLogger("areal_m2po")
    # only this handler: one an earlier in-process run left on a closed stream would print a
    # logging error onto the terminal
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "propagate", False)
    root.addHandler(handler)
    try:
        with StepProgress(2, 0, term) as bar:
            log.warning("step 1 | reward=0.100")
            bar.update(1, {"reward/mean": 0.1})
        # the bar was cleared for the line, which stands alone, then drawn again below it
        screens = _screens(term.getvalue())
        line = screens.index("step 1 | reward=0.100")
        assert screens[line - 1].startswith("train:   0%")
        assert screens[line + 1].startswith("train:   0%") and "1/2" in screens[-1]
        assert handler in root.handlers  # the package's own handler is back afterwards
    finally:
        root.removeHandler(handler)
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        with StepProgress(2, 0, stream, enabled=enabled) as bar:
            bar.update(1, {"reward/mean": 0.1})
            bar.update(2, {"reward/mean": 0.2})
        assert stream.getvalue() == ""
        assert bar.figures == {"reward/mean": 0.2}


def test_headline_names_the_figures_of_each_trainer():
    assert headline({"reward/mean": 0.5, "eval/accuracy": 0.25}) == "reward=0.500, eval_acc=0.250"
    assert headline({"sft/loss": 1.5, "eval/perplexity": 3.0}) == "loss=1.5000, eval_ppl=3.000"
    assert headline({"train/loss": 0.7, "eval/accuracy": 0.9}) == "loss=0.7000, eval_acc=0.900"
    assert headline({}) == ""
