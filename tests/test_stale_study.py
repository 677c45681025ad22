"""scripts/stale_study.py end to end on the tiny built-in model (seconds)."""

from __future__ import annotations

import csv
import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "stale_study.py"
REQUIRED = (
    "method",
    "staleness",
    "seed",
    "final_accuracy",
    "best_accuracy",
    "masked_or_clipped_fraction",
    "collapsed",
)


def _load():
    spec = importlib.util.spec_from_file_location("stale_study", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["stale_study"] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def study():
    return _load()


def _tiny_args(tmp: Path, methods: str, *extra: str) -> list[str]:
    return [
        "--model=builtin:tiny",
        "--reward=toy_rewards:digit_fraction",
        "--steps=2",
        "--staleness=1",
        f"--methods={methods}",
        "--seeds=3",
        "--batch-size=2",
        "--n-samples=4",
        "--max-new-tokens=6",
        "--lr=3e-3",
        "--eval-size=8",
        "--eval-every=1",
        "--threads=1",
        "--parallel=1",
        f"--out-dir={tmp / 'runs'}",
        f"--csv={tmp / 'study.csv'}",
        f"--png={tmp / 'study.png'}",
        f"--md={tmp / 'study.md'}",
        *extra,
    ]


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, study):
    tmp = tmp_path_factory.mktemp("stale_study")
    args = _tiny_args(tmp, "grpo_onpolicy,grpo,grpo_noclip,m2po")
    assert study.main(args) == 0
    return tmp, args


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_pipeline_writes_csv_png_md(tiny_study):
    tmp, _ = tiny_study
    rows = _rows(tmp / "study.csv")
    assert [r["method"] for r in rows] == ["grpo_onpolicy", "grpo", "grpo_noclip", "m2po"]
    for r in rows:
        for col in REQUIRED:
            assert col in r and r[col] != "", (r["method"], col)
        assert 0.0 <= float(r["final_accuracy"]) <= float(r["best_accuracy"]) <= 1.0
        assert r["collapsed"] in ("yes", "no")
        assert r["steps_done"] == "2" and r["eval_n"] == "8"
    assert {r["method"]: r["staleness"] for r in rows} == {
        "grpo_onpolicy": "0",
        "grpo": "1",
        "grpo_noclip": "1",
        "m2po": "1",
    }
    assert (tmp / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp / "study.md").read_text()
    assert "python scripts/stale_study.py" in md and "| m2po | 1 | 3 |" in md
    assert "study.png" in md
    # settings are read back from the runs' own config.yaml
    assert '(`actor.path`): `"builtin:tiny"`' in md
    assert "(`total_train_steps`): `2`" in md
    assert "- wall time:" in md
    assert (tmp / "runs" / "study_command.txt").read_text().count("stale_study.py") == 1


def test_each_run_has_its_own_dir_with_exact_staleness_and_method_config(tiny_study, study):
    tmp, _ = tiny_study
    for method, s in (("grpo_onpolicy", 0), ("grpo", 1), ("grpo_noclip", 1), ("m2po", 1)):
        run_dir = tmp / "runs" / f"{method}_s{s}_seed3"
        records = study.read_metrics(str(run_dir))
        train = [r for r in records if "actor/version" in r]
        assert len(train) == 2
        for t, r in enumerate(train):
            assert r["rollout/version_max"] == max(t - s, 0)
        info = json.loads((run_dir / "study_run.json").read_text())
        assert info["rc"] == 0 and "areal_m2po.train" in info["command"]
        cfg = (run_dir / "config.yaml").read_text()
        if method == "m2po":
            assert "m2_threshold: 0.04" in cfg and "use_decoupled_loss: true" in cfg
            assert "m2po/masked_fraction" in train[-1]
        else:
            assert "m2_threshold: null" in cfg and "recompute_logprob: false" in cfg


def test_summary_numbers_come_from_metrics(tiny_study, study):
    tmp, _ = tiny_study
    row = next(r for r in _rows(tmp / "study.csv") if r["method"] == "grpo")
    records = study.read_metrics(str(tmp / "runs" / "grpo_s1_seed3"))
    accs = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    assert float(row["final_accuracy"]) == pytest.approx(accs[-1], abs=1e-4)
    assert float(row["best_accuracy"]) == pytest.approx(max(accs), abs=1e-4)
    clip = [
        r["actor/clip_fraction"]
        for r in records
        if "actor/clip_fraction" in r and r["actor/grad_norm"] > 0
    ]
    assert int(row["updates_with_signal"]) == len(clip) > 0
    assert float(row["masked_or_clipped_fraction"]) == pytest.approx(
        sum(clip) / len(clip), abs=1e-4
    )


def test_replot_keeps_reading_and_reports_missing_runs(tiny_study, study):
    tmp, args = tiny_study
    md = tmp / "study.md"
    text = md.read_text().replace("(not written yet)", "hand-written reading")
    md.write_text(text)
    (tmp / "study.png").unlink()
    more = [a for a in args if not a.startswith("--methods")] + [
        "--methods=grpo_onpolicy,grpo,grpo_noclip,m2po,m2po_sapo",
        "--replot",
    ]
    assert study.main(more) == 0
    assert (tmp / "study.png").exists()
    text = md.read_text()
    assert "hand-written reading" in text
    assert "Missing or incomplete runs: m2po_sapo_s1_seed3" in text
    assert "# summary regenerated with:" in text
    assert len(_rows(tmp / "study.csv")) == 4


def test_complete_runs_are_skipped(tiny_study, study, capsys):
    tmp, args = tiny_study
    assert study.main([a for a in args if not a.startswith("--methods")] + ["--methods=grpo"]) == 0
    assert "grpo_s1_seed3: complete, skipped" in capsys.readouterr().out


def test_collapse_definition(study, tmp_path):
    run = tmp_path / "m2po_s4_seed1"
    run.mkdir()
    accs = {0: 0.25, 5: 0.8, 10: 0.35}
    with open(run / "metrics.jsonl", "w") as fh:
        for step in range(11):
            rec = {"step": step}
            if step:
                rec.update({"actor/grad_norm": 1.0, "m2po/masked_fraction": 0.1})
            if step in accs:
                rec.update({"eval/accuracy": accs[step], "eval/n": 64})
            fh.write(json.dumps(rec) + "\n")
    row = study.summarise_run(str(run), "m2po", 4, 1, 10)
    assert row["collapsed"] is True  # 0.35 < 0.5 * 0.8
    assert row["best_step"] == 5 and row["masked_or_clipped_fraction"] == pytest.approx(0.1)


def test_bad_method_is_rejected(study):
    with pytest.raises(SystemExit):
        study.parse_args(["--methods=grpo,nope"])


def test_subprocess_path_through_a_launcher(study, tmp_path):
    """--launcher runs each arm as its own process (as `accelerate launch` would)."""
    args = _tiny_args(tmp_path, "m2po", f"--launcher={shlex.quote(sys.executable)}")
    args = [a for a in args if not a.startswith("--steps")] + ["--steps=1", "--eval-every=5"]
    assert study.main(args) == 0
    run_dir = tmp_path / "runs" / "m2po_s1_seed3"
    info = json.loads((run_dir / "study_run.json").read_text())
    assert info["rc"] == 0 and info["command"].startswith(shlex.quote(sys.executable))
    assert "training 1 steps" in (run_dir / "train.log").read_text()
    assert _rows(tmp_path / "study.csv")[0]["steps_done"] == "1"


def test_train_command_and_device_slots(study):
    spec = study.RunSpec("m2po", 4, 1, "/x/m2po_s4_seed1", ["actor.m2_threshold=0.04"])
    cmd = study.train_command(spec, "accelerate launch --num_processes 4")
    assert cmd == [
        "accelerate",
        "launch",
        "--num_processes",
        "4",
        "-m",
        "areal_m2po.train",
        "actor.m2_threshold=0.04",
    ]
    assert study.train_command(spec)[:3] == [sys.executable, "-m", "areal_m2po.train"]
    assert study.device_slots(2, 0, None) == [None, None]
    assert study.device_slots(2, 2, None) == ["0,1", "2,3"]
    assert study.device_slots(2, 1, "4,5,6") == ["4", "5"]
    with pytest.raises(ValueError, match="need 4 devices"):
        study.device_slots(2, 2, "0,1")
