"""scripts/plot_distillation.py: the comparison figure from two runs' metrics, its step cut and
its one-line error for a missing run."""

from __future__ import annotations

import json
from pathlib import Path

from script_loader import load_script


def _run(folder: Path, rows: list[dict]) -> Path:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_plot_draws_both_runs_up_to_the_cut(tmp_path, capsys):
    plot = load_script("scripts/plot_distillation.py")
    rl = _run(
        tmp_path / "rl",
        [{"step": s, "eval/accuracy": 0.2 + 0.01 * s, "eval/accuracy_se": 0.03} for s in (0, 3, 6)]
        + [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2, 3, 4, 5, 6)],
    )
    distill = _run(
        tmp_path / "distill",
        [{"step": 0, "eval/accuracy": 0.2}, {"step": 3, "eval/accuracy": 0.5}]
        + [{"step": s, "reward/mean": 0.2, "distill/reverse_kl": 1.0 / s} for s in (1, 2, 3)],
    )
    out = tmp_path / "cmp.png"
    assert plot.main([str(rl), str(distill), "--out", str(out), "--max-step", "3"]) == 0
    assert out.stat().st_size > 0 and capsys.readouterr().out.strip() == str(out)
    runs = [("rl", plot._records(str(rl), 3)), ("distill", plot._records(str(distill), 3))]
    fig = plot.build_figure(runs)
    accuracy, reward, kl = fig.axes
    assert [list(line.get_xdata()) for line in accuracy.get_lines()] == [[0, 3], [0, 3]]
    assert len(reward.get_lines()) == 2 and len(kl.get_lines()) == 1  # the RL run has no KL
    assert list(kl.get_lines()[0].get_ydata()) == [1.0, 0.5, 1.0 / 3]


def test_missing_run_is_one_error_line(tmp_path, capsys):
    plot = load_script("scripts/plot_distillation.py")
    assert plot.main([str(tmp_path / "nope"), str(tmp_path / "nope2")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "metrics.jsonl does not exist" in err and "\n" not in err
