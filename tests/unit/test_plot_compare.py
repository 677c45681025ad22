"""``python -m areal_m2po.plot RUN_A RUN_B --out F.png``: the comparison figure draws each run's
metrics, fractions in percent, one colour per run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from areal_m2po import plot


def _run(root: Path, name: str, rows: list[dict]) -> Path:
    run_dir = root / name
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


M2PO_ROWS = [
    {"step": 0, "eval/accuracy": 0.2},
    {"step": 1, "reward/mean": 0.1, "m2po/masked_fraction": 0.0, "actor/clip_fraction": 0.0},
    {"step": 2, "reward/mean": 0.3, "m2po/masked_fraction": 0.05, "actor/clip_fraction": 0.0},
    {"step": 2, "eval/accuracy": 0.4},
]
GRPO_ROWS = [
    {"step": 0, "eval/accuracy": 0.2},
    {"step": 1, "reward/mean": 0.1, "actor/clip_fraction": 0.0},
    {"step": 2, "reward/mean": 0.2, "actor/clip_fraction": 0.125},
    {"step": 2, "eval/accuracy": 0.3},
]


def _points(line) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in zip(line.get_xdata(), line.get_ydata())]


def test_comparison_panels_hold_each_runs_metrics():
    fig = plot.build_comparison([("m2po", M2PO_ROWS), ("grpo", GRPO_ROWS)])
    axes = {ax.get_title(): ax for ax in fig.axes}
    assert sorted(axes) == sorted(p.title for p in plot.COMPARE_PANELS)

    acc = {ln.get_label(): ln for ln in axes["held-out greedy accuracy"].get_lines()}
    assert _points(acc["m2po: accuracy"]) == [(0, 0.2), (2, 0.4)]
    assert _points(acc["grpo: accuracy"]) == [(0, 0.2), (2, 0.3)]
    assert acc["m2po: accuracy"].get_color() != acc["grpo: accuracy"].get_color()

    frac = {
        ln.get_label(): ln for ln in axes["tokens out of the gradient (% of a step's)"].get_lines()
    }
    # percent; a run that did not log a key has no line for it
    assert sorted(frac) == ["grpo: PPO clipped", "m2po: M2PO masked", "m2po: PPO clipped"]
    assert _points(frac["m2po: M2PO masked"]) == [(1, 0.0), (2, 5.0)]
    assert _points(frac["grpo: PPO clipped"]) == [(1, 0.0), (2, 12.5)]
    # one colour per run, the line style per metric
    assert frac["m2po: M2PO masked"].get_color() == frac["m2po: PPO clipped"].get_color()
    assert frac["m2po: M2PO masked"].get_linestyle() != frac["m2po: PPO clipped"].get_linestyle()

    entropy = axes["policy entropy"]
    assert entropy.get_lines() == [] and entropy.texts[0].get_text() == "not logged"


def test_main_compares_several_runs(tmp_path: Path, capsys):
    a = _run(tmp_path, "a", M2PO_ROWS)
    b = _run(tmp_path, "b", GRPO_ROWS)
    out = tmp_path / "cmp.png"
    assert plot.main([str(a), str(b), "--out", str(out), "--labels", "M2PO,GRPO"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.strip() == str(out)
    # default labels: the directories' names
    assert plot.main([str(a), str(b), "--out", str(out)]) == 0

    assert plot.main([str(a), str(b), "--out", str(out), "--labels", "only-one"]) == 2
    assert "--labels: 1 labels for 2 runs" in capsys.readouterr().err
    assert plot.main([str(a), str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "missing/metrics.jsonl does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        plot.main([str(a), str(b)])
    assert exc.value.code == 2
    assert "--out is required when comparing several runs" in capsys.readouterr().err


def test_out_in_a_missing_folder_or_naming_a_folder_names_out(tmp_path: Path, capsys):
    """Found in the new-user sweep: ``--out`` in a folder that does not exist ended in
    ``error: [Errno 2] No such file or directory: ...`` after the figure was drawn."""
    a = _run(tmp_path, "a", M2PO_ROWS)
    out = tmp_path / "nodir" / "c.png"
    assert plot.main([str(a), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out: {out}: {out.parent} is not a folder; name the PNG file to write"
    assert plot.main([str(a), "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: --out: {tmp_path}: is a folder")
    assert not out.parent.exists()
