"""The run every trainer shares (trainer/step_loop.py): StepLoop.train's order of events and
run_trainer's exit statuses, on a toy trainer without a model (no process group, no files:
``is_main`` false, so no config.yaml is written)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import pytest

from areal_m2po.api.errors import NonFiniteTrainingError
from areal_m2po.trainer import step_loop
from areal_m2po.trainer.step_loop import StepLoop, run_trainer


class _Logger:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def start(self, resume_step: int = 0) -> None:
        self.events.append(("start", resume_step))

    def log(self, step: int, stats: dict[str, float]) -> None:
        self.events.append(("log", step, sorted(k for k in stats if not k.startswith("timing"))))

    def progress(self, total: int, initial: int) -> contextlib.nullcontext:
        self.events.append(("progress", total, initial))
        return contextlib.nullcontext()

    def close(self) -> None:
        self.events.append("close")


class Toy(StepLoop):
    """Three steps; evaluation every 2 steps and at start; a save at the end."""

    def __init__(self, config: Any, skipped_from: int | None = None) -> None:
        self.events: list[Any] = []
        self.config = config
        self.step, self.total_steps = 0, 3
        self.stats_logger = _Logger(self.events)
        self.accelerator = SimpleNamespace(free_memory=lambda: self.events.append("free"))
        self.loader = SimpleNamespace(steps_per_epoch=3)
        self.output_dir, self.is_main = "/nonexistent", False
        self.skipped_from = skipped_from

    def _begin(self) -> None:
        self.events.append("begin")

    def _before_loop(self) -> None:
        self.events.append("before_loop")

    def _one_step(self) -> dict[str, float]:
        skipped = self.skipped_from is not None and self.step + 1 >= self.skipped_from
        self.events.append(("step", self.step + 1))
        return {"toy/loss": 1.0, "toy/skipped": float(skipped)}

    def evaluate(self) -> dict[str, float]:
        return {"eval/loss": 0.5}

    def save_hf(self, tag: str) -> str:
        self.events.append(("save", tag))
        return tag


def _config(**evaluator: Any) -> SimpleNamespace:
    ev = {"freq_steps": 2, "freq_epochs": None, "freq_secs": None, "eval_at_start": True}
    ev.update(eval_at_end=False, **evaluator)
    return SimpleNamespace(
        evaluator=SimpleNamespace(**ev),
        saver=SimpleNamespace(freq_steps=None, freq_epochs=None, freq_secs=None, save_at_end=True),
        model=SimpleNamespace(max_consecutive_skipped_steps=2),
    )


@pytest.fixture(autouse=True)
def _no_process_group(monkeypatch):
    monkeypatch.setattr(step_loop.dist, "end_process_group", lambda: None)


def test_train_runs_the_shared_order_of_events():
    toy = Toy(_config())
    toy.train()
    assert toy.events == [
        ("start", 0),
        "begin",
        ("log", 0, ["eval/loss"]),
        "before_loop",
        ("progress", 3, 0),
        ("step", 1),
        ("log", 1, ["toy/loss", "toy/skipped"]),
        ("step", 2),
        ("log", 2, ["eval/loss", "toy/loss", "toy/skipped"]),
        ("step", 3),
        ("log", 3, ["toy/loss", "toy/skipped"]),
        ("save", "final"),
    ]
    quiet = Toy(_config(eval_at_start=False))
    quiet.train()
    assert ("log", 0, ["eval/loss"]) not in quiet.events


def test_run_trainer_exit_statuses(capsys):
    built: list[Toy] = []

    def build(config: Any) -> Toy:
        built.append(Toy(config))
        return built[-1]

    assert run_trainer(build, _config()) == 0 and built[-1].events[-1] == "free"

    def bad_input(config: Any) -> Toy:
        raise ValueError("data.jsonl:3: missing field 'prompt'")

    assert run_trainer(bad_input, _config()) == 2
    assert capsys.readouterr().err.strip().endswith("data.jsonl:3: missing field 'prompt'")

    def failing(config: Any) -> Toy:
        built.append(Toy(config, skipped_from=1))  # two skipped steps in a row: stop
        return built[-1]

    assert run_trainer(failing, _config()) == NonFiniteTrainingError("x").exit_status
    assert "close" in built[-1].events and ("save", "final") not in built[-1].events
    assert "model.max_consecutive_skipped_steps=2" in capsys.readouterr().err


class _Broken(Toy):
    handles = False

    def _one_step(self) -> dict[str, float]:
        raise KeyError("boom")

    def failure_status(self, exc: Exception) -> int | None:
        return 7 if isinstance(exc, KeyError) and self.handles else None


@pytest.mark.parametrize("handles", [True, False])
def test_run_trainer_asks_the_trainer_about_other_errors_and_always_closes(handles):
    trainers: list[_Broken] = []

    def build(config: Any) -> _Broken:
        trainers.append(_Broken(config))
        trainers[-1].handles = handles
        return trainers[-1]

    if handles:
        assert run_trainer(build, _config()) == 7
    else:
        with pytest.raises(KeyError, match="boom"):
            run_trainer(build, _config())
    assert "close" in trainers[-1].events
