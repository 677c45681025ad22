"""The stale-data study (research/stale_study) end to end on the tiny built-in model (seconds):
arms and rounds from YAML, resumable runs, finished runs archived and skipped, the report from
run directories alone, each round's verdict rules, and the committed reports regenerated
from the committed runs."""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pytest

from research.stale_study import cli, verdicts
from research.stale_study.arms import load_arms_file
from research.stale_study.rounds import load_round
from research.stale_study.runs import RunKey, read_metrics

REPO = Path(__file__).resolve().parents[2]
ARMS = ("grpo_onpolicy", "grpo", "grpo_noclip", "m2po")


@pytest.fixture(scope="module")
def study():
    return cli


def _tiny_args(tmp: Path, arms: str, *extra: str, seeds: str = "3") -> list[str]:
    return [
        "--round=2",
        "--model=builtin:tiny",
        "--reward=toy_rewards:digit_fraction",
        "--steps=2",
        "--staleness=1",
        f"--arms={arms}",
        f"--seeds={seeds}",
        "--batch-size=2",
        "--n-samples=4",
        "--max-new-tokens=6",
        "--lr=3e-3",
        "--eval-size=8",
        "--eval-batch-size=8",
        "--eval-every=1",
        "--threads=1",
        "--parallel=1",
        "--recover-every=1",
        f"--work-dir={tmp / 'work'}",
        f"--archive-dir={tmp / 'repo' / 'runs'}",
        f"--csv={tmp / 'repo' / 'study.csv'}",
        f"--png={tmp / 'repo' / 'study.png'}",
        f"--md={tmp / 'repo' / 'study.md'}",
        "--round1-csv=",
        "--pilot-staleness=",
        *extra,
    ]


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory, study):
    tmp = tmp_path_factory.mktemp("stale_study")
    args = _tiny_args(tmp, ",".join(ARMS))
    assert study.main(args) == 0
    return tmp, args


def _metrics(run_dir: Path) -> list[dict]:
    return read_metrics(str(run_dir))


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_arms_come_from_yaml(study, tmp_path):
    arms, defaults = load_arms_file()
    assert list(arms)[:4] == list(ARMS)
    assert arms["grpo"].staleness == "stale" and arms["grpo_onpolicy"].staleness == "on_policy"
    assert "actor.m2_threshold=null" in arms["grpo"].overrides
    assert "actor.m2_threshold=0.04" in arms["m2po"].overrides and arms["m2po"].uses_m2po
    assert defaults["eval_size"] >= 256 and defaults["lr"] == pytest.approx(1e-5)
    bad = tmp_path / "arms.yaml"
    bad.write_text("arms:\n  x:\n    staleness: sometimes\n    metric: actor/clip_fraction\n")
    with pytest.raises(ValueError, match=r"arms\.x\.staleness"):
        load_arms_file(str(bad))
    with pytest.raises(SystemExit):
        study.parse_args(["--round=2", f"--arms-file={bad}"])
    with pytest.raises(SystemExit):
        study.parse_args(["--round=2", "--arms=grpo,nope"])


def test_pipeline_writes_csv_png_md(tiny_study):
    tmp, _ = tiny_study
    rows = _rows(tmp / "repo" / "study.csv")
    assert [r["arm"] for r in rows] == list(ARMS)
    for r in rows:
        assert 0.0 <= float(r["final_accuracy"]) <= float(r["best_accuracy"]) <= 1.0
        assert r["collapsed"] in ("yes", "no") and r["done"] == "yes"
        assert r["steps_done"] == "2" and r["eval_n"] == "8"
    assert {r["arm"]: r["staleness"] for r in rows} == {
        "grpo_onpolicy": "0",
        "grpo": "1",
        "grpo_noclip": "1",
        "m2po": "1",
    }
    assert (tmp / "repo" / "study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (tmp / "repo" / "study.md").read_text()
    assert "**4 of 4 runs of the study (s=1) are finished.**" in md
    assert "| m2po | 1 | 1 of 1 |" in md  # per-arm table: seeds finished
    # one seed: no claim can be judged
    assert md.count("**pending**") == 5 and "reproduced**" not in md
    assert '(`actor.path`): `"builtin:tiny"`' in md and "(`total_train_steps`): `2`" in md
    assert "python -m research.stale_study --round=2" in md and "study.png" in md


def test_runs_are_exact_resumable_and_archived_without_weights(tiny_study, study):
    tmp, _ = tiny_study
    for arm, s in (("grpo_onpolicy", 0), ("grpo", 1), ("grpo_noclip", 1), ("m2po", 1)):
        work = tmp / "work" / f"{arm}_s{s}_seed3"
        train = [r for r in _metrics(work) if "actor/version" in r]
        assert [r["rollout/version_max"] for r in train] == [max(t - s, 0) for t in range(2)]
        cfg = (work / "config.yaml").read_text()
        assert "mode: auto" in cfg and "keep_last: 1" in cfg and "save_at_end: false" in cfg
        if arm == "m2po":
            assert "m2_threshold: 0.04" in cfg and "use_decoupled_loss: true" in cfg
        else:
            assert "m2_threshold: null" in cfg and "recompute_logprob: false" in cfg
        assert not (work / "recover").exists()  # deleted once the run finished
        done = json.loads((work / "done.json").read_text())
        assert done["steps"] == 2 and done["attempts"] == 1 and done["commit"]
        assert done["cpu_s"] > 0 and done["wall_s"] > 0
        archived = tmp / "repo" / "runs" / work.name
        assert sorted(p.name for p in archived.iterdir()) == sorted(
            ["config.yaml", "done.json", "metrics.jsonl", "study_run.json"]
        )


def test_summary_numbers_come_from_metrics(tiny_study, study):
    tmp, _ = tiny_study
    row = next(r for r in _rows(tmp / "repo" / "study.csv") if r["arm"] == "grpo")
    records = _metrics(tmp / "repo" / "runs" / "grpo_s1_seed3")
    accs = [r["eval/accuracy"] for r in records if "eval/accuracy" in r]
    assert len(accs) == 3  # updates 0, 1, 2
    assert float(row["final_accuracy"]) == pytest.approx(accs[-1])
    assert float(row["best_accuracy"]) == pytest.approx(max(accs))
    # trapezoids over updates 0..2, divided by 2 updates
    assert float(row["auc_accuracy"]) == pytest.approx((accs[0] + 2 * accs[1] + accs[2]) / 4)
    sig = [r for r in records if r.get("actor/grad_norm", 0) > 0]
    clip = [r["actor/clip_fraction"] for r in sig]
    assert int(row["updates_with_signal"]) == len(clip) > 0
    assert float(row["masked_or_clipped_fraction"]) == pytest.approx(sum(clip) / len(clip))
    kl = [r["actor/approx_kl"] for r in sig]  # no proximal forward: behave - current
    assert float(row["behave_kl"]) == pytest.approx(sum(kl) / len(kl))
    steps_s = sorted(r["timing/step_s"] for r in records if "actor/version" in r)
    assert float(row["step_s_median"]) == pytest.approx(sum(steps_s) / 2, rel=1e-5)  # 2 updates
    m2po = next(r for r in _rows(tmp / "repo" / "study.csv") if r["arm"] == "m2po")
    assert m2po["m2_before"] != "" and row["m2_before"] == ""


def test_finished_runs_are_skipped_and_replot_works_from_the_archive(
    tiny_study, study, capsys, tmp_path
):
    src, src_args = tiny_study
    tmp = tmp_path / "study"  # this test deletes and rewrites the study's files: its own copy,
    shutil.copytree(src, tmp)  # so the other tests pass in any order
    args = [a.replace(str(src), str(tmp)) for a in src_args]
    shutil.rmtree(tmp / "work" / "grpo_s1_seed3")  # a fresh clone: only the archive is left
    assert study.main([a for a in args if not a.startswith("--arms")] + ["--arms=grpo"]) == 0
    assert "grpo_s1_seed3: finished" in capsys.readouterr().out
    assert not (tmp / "work" / "grpo_s1_seed3").exists()
    md = tmp / "repo" / "study.md"
    md.write_text(md.read_text().replace("(not written yet)", "hand-written reading", 1))
    (tmp / "repo" / "study.png").unlink()
    shutil.rmtree(tmp / "work")
    more = [a for a in args if not a.startswith(("--arms", "--seeds"))]
    assert study.main([*more, f"--arms={','.join(ARMS)},m2po_sapo", "--seeds=3,4", "--replot"]) == 0
    text = md.read_text()
    assert "hand-written reading" in text and (tmp / "repo" / "study.png").exists()
    assert "**4 of 10 runs of the study (s=1) are finished.**" in text
    assert "m2po_sapo_s1_seed3 (not started)" in text and "grpo_s1_seed4 (not started)" in text
    assert "# report regenerated with:" in text
    assert len(_rows(tmp / "repo" / "study.csv")) == 4


def test_a_stopped_run_resumes_from_its_checkpoint(study, tmp_path):
    args = _tiny_args(tmp_path, "m2po")
    # first attempt stops after update 1 (as if killed): not finished, checkpoint kept
    assert study.main([*args, "--set=total_train_steps=1"]) == 1
    work = tmp_path / "work" / "m2po_s1_seed3"
    assert not (work / "done.json").exists() and (work / "recover" / "step_1").is_dir()
    md = (tmp_path / "repo" / "study.md").read_text()
    assert "m2po_s1_seed3 (in progress: update 1/2)" in md
    assert study.main(args) == 0
    info = json.loads((work / "study_run.json").read_text())
    assert [a["resumed_from_step"] for a in info["attempts"]] == [0, 1]
    assert [a["rc"] for a in info["attempts"]] == [0, 0]
    steps = [r["step"] for r in _metrics(work) if "actor/version" in r]
    assert steps == [1, 2]  # update 1 is not trained twice
    assert json.loads((work / "done.json").read_text())["attempts"] == 2


def test_parallel_subprocess_runs(study, tmp_path):
    """--parallel 2: each run is its own `python -m areal_m2po.train` process, as in the study."""
    args = _tiny_args(tmp_path, "grpo_onpolicy,m2po", "--parallel=2")
    args = [a for a in args if not a.startswith("--steps")] + ["--steps=1"]
    assert study.main(args) == 0
    for name in ("grpo_onpolicy_s0_seed3", "m2po_s1_seed3"):
        work = tmp_path / "work" / name
        info = json.loads((work / "study_run.json").read_text())
        assert info["attempts"][0]["rc"] == 0 and "-m areal_m2po.train" in info["command"]
        assert info["attempts"][0]["cpu_s"] > 1.0  # the child's own CPU time (os.wait4)
        assert "training 1 steps" in (work / "train.log").read_text()
        assert (work / "done.json").exists()
    assert [r["steps_done"] for r in _rows(tmp_path / "repo" / "study.csv")] == ["1", "1"]


def test_collapse_and_paired_statistics(study, tmp_path):
    from research.stale_study.summary import paired_difference, summarise_run

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
    row = summarise_run(str(run), RunKey("m2po", 4, 1), 10, "m2po/masked_fraction")
    assert row["collapsed"] == "" and row["final_accuracy"] == 0.35  # not finished: not judged
    (run / "done.json").write_text(json.dumps({"steps": 10}))
    row = summarise_run(str(run), RunKey("m2po", 4, 1), 10, "m2po/masked_fraction")
    assert row["collapsed"] is True  # 0.35 < 0.5 * 0.8
    assert row["best_step"] == 5 and row["masked_or_clipped_fraction"] == pytest.approx(0.1)
    assert row["auc_accuracy"] == pytest.approx((5 * (0.25 + 0.8) / 2 + 5 * (0.8 + 0.35) / 2) / 10)
    a = [{"seed": s, "x": v} for s, v in ((1, 0.5), (2, 0.6), (3, 0.7))]
    b = [{"seed": s, "x": v} for s, v in ((1, 0.4), (2, 0.6), (3, 0.5), (4, 0.9))]
    d = paired_difference(a, b, "x")  # diffs 0.1, 0.0, 0.2: mean 0.1, sd 0.1
    assert d["n"] == 3 and d["mean"] == pytest.approx(0.1)
    assert d["se"] == pytest.approx(0.1 / 3**0.5)
    assert d["hi"] - d["mean"] == pytest.approx(4.303 * 0.1 / 3**0.5)


def test_run_times_count_the_attempts_that_made_the_run(study, tmp_path):
    """An attempt killed with its scheduler records no time: a run that resumed from its
    checkpoints has an unknown time (blank), not the sum of the other attempts (the bug: 3
    minutes for a 60-minute run); one redone from update 0 is timed by the redo."""
    from research.stale_study.summary import summarise_run

    run = tmp_path / "grpo_s4_seed1"
    run.mkdir()
    with open(run / "metrics.jsonl", "w") as fh:
        for step in range(3):
            fh.write(json.dumps({"step": step, "eval/accuracy": 0.5, "eval/n": 64}) + "\n")
    (run / "done.json").write_text(json.dumps({"steps": 2}))

    def times(*attempts: dict) -> tuple:
        info = {"attempts": list(attempts), "wall_s": -1.0, "cpu_s": -1.0}  # sums not read
        (run / "study_run.json").write_text(json.dumps(info))
        row = summarise_run(str(run), RunKey("grpo", 4, 1), 2, "actor/clip_fraction")
        return row["wall_s"], row["cpu_s"]

    killed = {"start": 1.0, "resumed_from_step": 0}
    resumed = {"start": 2.0, "resumed_from_step": 1, "wall_s": 200.0, "cpu_s": 190.0}
    assert times(killed, resumed) == ("", "")  # unknown, as for a run still going
    first = {"start": 1.0, "resumed_from_step": 0, "wall_s": 1000.0, "cpu_s": 900.0}
    assert times(first, resumed) == (1200.0, 1090.0)
    # killed before its first checkpoint: the next attempt started over and made the whole run
    restarted = {"start": 2.0, "resumed_from_step": 0, "wall_s": 1300.0, "cpu_s": 1250.0}
    assert times(killed, restarted) == (1300.0, 1250.0)
    assert times(killed, restarted, resumed) == (1500.0, 1440.0)


def _d(m: float, se: float, lo: float, hi: float, n: int = 3) -> dict:
    return {"mean": m, "se": se, "lo": lo, "hi": hi, "n": n}


def test_round2_verdict_rules():
    r2 = load_round("2")
    assert (r2.margin, r2.measure, r2.equivalence) == (0.05, "final_accuracy", False)
    m = r2.margin
    assert verdicts.loses(_d(-0.10, 0.02, -0.18, -0.02), m) == "reproduced"
    assert verdicts.loses(_d(0.01, 0.01, -0.03, 0.05), m) == "not reproduced"
    assert verdicts.loses(_d(-0.05, 0.03, -0.18, 0.08), m) == "inconclusive at this power"
    assert verdicts.keeps(_d(0.0, 0.01, -0.04, 0.04), m) == "reproduced"
    assert verdicts.keeps(_d(0.2, 0.01, 0.1, 0.3), m) == "reproduced"  # above
    assert verdicts.keeps(_d(-0.1, 0.05, -0.3, 0.1), m) == "inconclusive at this power"
    assert verdicts.keeps(_d(-0.2, 0.02, -0.3, -0.1), m) == "not reproduced"
    assert verdicts.beats(_d(0.1, 0.02, 0.01, 0.19), m) == "reproduced"
    # without the equivalence rule a tight interval around 0 stays inconclusive
    assert verdicts.beats(_d(0.0, 0.01, -0.02, 0.02), m) == "inconclusive at this power"
    assert verdicts.collapses({"collapsed": 0, "n": 3}, _d(0, 0.01, -0.04, 0.04), m) == (
        "not reproduced"
    )
    assert verdicts.collapses({"collapsed": 2, "n": 3}, _d(0, 0.01, -0.04, 0.04), m) == (
        "reproduced"
    )
    masked = next(c for c in r2.claims if c.rule == "masked_below")
    assert masked.max_fraction == pytest.approx(10 * 0.0006)
    assert verdicts.masked_below(0.0005, 0.0001, masked.max_fraction) == "reproduced"
    assert verdicts.masked_below(0.08, 0.01, masked.max_fraction) == "not reproduced"
    assert verdicts.masked_below(0.005, 0.001, masked.max_fraction) == "inconclusive at this power"


def test_round3_verdict_rules():
    r3 = load_round("3")
    assert (r3.margin, r3.measure, r3.equivalence) == (0.03, "auc_accuracy", True)

    def d(lo: float, hi: float) -> dict:
        return {"n": 3, "mean": (lo + hi) / 2, "se": (hi - lo) / 8.6, "lo": lo, "hi": hi}

    m, eq = r3.margin, r3.equivalence
    # loses: below 0 / a 3-point loss excluded / neither
    assert verdicts.loses(d(-0.10, -0.01), m) == "reproduced"
    assert verdicts.loses(d(-0.029, 0.05), m) == "not reproduced"
    assert verdicts.loses(d(-0.08, 0.02), m) == "inconclusive at this power"
    # keeps (non-inferiority at 3 points): the mirror image, the boundary itself not enough
    assert verdicts.keeps(d(-0.029, 0.05), m) == "reproduced"
    assert verdicts.keeps(d(-0.03, 0.05), m) == "inconclusive at this power"
    assert verdicts.keeps(d(-0.10, -0.01), m) == "not reproduced"
    # beats
    assert verdicts.beats(d(0.001, 0.05), m, eq) == "reproduced"
    assert verdicts.beats(d(-0.05, -0.001), m, eq) == "not reproduced"
    assert verdicts.beats(d(-0.02, 0.02), m, eq).startswith("not reproduced (no difference")
    assert verdicts.beats(d(-0.05, 0.02), m, eq) == "inconclusive at this power"
    # the regime: at most 1% masked
    regime = next(c for c in r3.claims if c.rule == "masked_at_most")
    assert verdicts.masked_at_most(0.01, regime.max_fraction) == "yes"
    assert verdicts.masked_at_most(0.0101, regime.max_fraction) == "no"
    assert "AUC " + verdicts.interval(d(-0.05, -0.01)) == (
        "AUC -3.0 points (standard error 0.5, 95% interval -5.0 to -1.0, 3 seeds)"
    )


def test_plan_puts_the_pilot_first(study):
    from research.stale_study.scheduler import plan

    arms, _ = load_arms_file()
    study_arms = [arms[a] for a in ARMS]
    names = [k.name for _, k in plan(study_arms, 8, [1, 2], arms["grpo"], [4, 8, 16])]
    assert names == [
        "grpo_onpolicy_s0_seed1",  # the pilot's reference
        "grpo_s8_seed1",  # the study's own s first: it is also a study run
        "grpo_s4_seed1",
        "grpo_s16_seed1",
        "grpo_onpolicy_s0_seed2",  # on-policy does not depend on s
        "grpo_noclip_s8_seed1",
        "m2po_s8_seed1",
        "grpo_s8_seed2",
        "grpo_noclip_s8_seed2",
        "m2po_s8_seed2",
    ]
    pilot = load_round("2").pilot
    assert pilot is not None and pilot.arm == "grpo" and pilot.staleness == (4, 8, 16)
    assert len(plan(study_arms, 8, [1, 2])) == 8  # no pilot


def test_a_finished_run_of_another_length_is_refused(study, tmp_path):
    run = tmp_path / "work" / "grpo_s1_seed3"
    run.mkdir(parents=True)
    (run / "done.json").write_text(json.dumps({"steps": 5}))
    args = _tiny_args(tmp_path, "grpo")
    assert study.main(args) == 2  # before any run starts


def test_length_probe_finds_the_shortest_rewarded_prefix(study):
    from areal_m2po.reward.math_reward import math_reward_fn
    from research.stale_study.length_probe import shortest_rewarded_prefix

    pieces = ["5", "9", " +", " 8", "1", " =", " 1", "4", "0", ".", " Done"]

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids)

    ids = list(range(len(pieces)))  # "59 + 81 = 140. Done"
    # " = 14" is not rewarded (last integer 14); " = 140" is: 9 tokens
    assert shortest_rewarded_prefix(ids, decode, math_reward_fn, "140", "") == 9
    assert shortest_rewarded_prefix(ids, decode, math_reward_fn, "141", "") is None
    assert shortest_rewarded_prefix(ids[:8], decode, math_reward_fn, "140", "") is None


def test_train_command_and_device_slots(study):
    from research.stale_study.scheduler import RunSpec, device_slots, train_command

    spec = RunSpec(RunKey("m2po", 4, 1), "/x/m2po_s4_seed1", ["actor.m2_threshold=0.04"])
    cmd = train_command(spec, "accelerate launch --num_processes 4")
    assert cmd == [
        "accelerate",
        "launch",
        "--num_processes",
        "4",
        "-m",
        "areal_m2po.train",
        "actor.m2_threshold=0.04",
    ]
    assert train_command(spec)[:3] == [sys.executable, "-m", "areal_m2po.train"]
    assert device_slots(2, 0, None) == [None, None]
    assert device_slots(2, 2, None) == ["0,1", "2,3"]
    assert device_slots(2, 1, "4,5,6") == ["4", "5"]
    with pytest.raises(ValueError, match="need 4 devices"):
        device_slots(2, 2, "0,1")


def _fake_run(root: Path, name: str, acc0: float, acc40: float, masked: float = 0.0) -> None:
    run = root / name
    run.mkdir(parents=True)
    records = [
        {"step": 0, "eval/accuracy": acc0, "eval/n": 256},
        {
            "step": 1,
            "actor/grad_norm": 1.0,
            "m2po/masked_fraction": masked,
            "actor/clip_fraction": masked,
            "m2po/trust_region_fraction": 0.25,
        },
        {"step": 40, "eval/accuracy": acc40, "eval/n": 256},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run / "done.json").write_text("{}")


def test_round3_report_from_run_directories(study, tmp_path):
    from research.stale_study.report import finished

    root = tmp_path / "runs"
    # AUC with evaluations at 0 and 40 only: (acc0 + acc40) / 2
    for seed, top in ((1, 0.8), (2, 0.9)):
        _fake_run(root, f"grpo_onpolicy_s0_seed{seed}", 0.2, top)  # AUC 0.50, 0.55
        _fake_run(root, f"grpo_s4_seed{seed}", 0.2, top - 0.2)  # 0.1 below, both seeds
        _fake_run(root, f"m2po_s4_seed{seed}", 0.2, top, masked=0.004)  # equal
    _fake_run(root, "m2po_tr_s4_seed1", 0.2, 0.8)  # one seed only: pending
    _fake_run(root, "grpo_s8_seed1", 0.2, 0.8)  # no cell of round 3 at s=4: not covered
    md, csv_path = tmp_path / "r3.md", tmp_path / "r3.csv"
    args = [
        "--round=3",
        "--replot",
        "--staleness=4",
        "--seeds=1,2",
        f"--archive-dir={root}",
        f"--work-dir={tmp_path / 'work'}",
        f"--md={md}",
        f"--csv={csv_path}",
    ]
    assert study.main(args) == 0
    assert len(_rows(csv_path)) == 7
    parsed = study.parse_args(args)
    from research.stale_study.report import ReportInputs, collect

    inp = ReportInputs(
        parsed.round_def, parsed.arm_defs, parsed.arms, 4, [1, 2], 40, [str(root)], "", "", ""
    )
    rows = finished(inp, collect(inp))
    assert {k: len(v) for k, v in rows.items()} == {
        ("grpo_onpolicy", 0): 2,
        ("grpo", 4): 2,
        ("m2po", 4): 2,
        ("m2po_tr", 4): 1,
    }
    got = {v.claim: (v.verdict, v.because) for v in verdicts.verdicts(inp.round, rows, 4, [1, 2])}
    assert got["s=4 is the paper's regime (M2PO masks at most 1% of the tokens)"] == (
        "yes",
        "M2PO (all tokens) masked 0.40% (standard error 0.00)",
    )
    assert got["clipped GRPO loses accuracy at s=4"] == (
        "reproduced",
        "AUC -10.0 points (standard error 0.0, 95% interval -10.0 to -10.0, 2 seeds)",
    )
    assert got["M2PO (all tokens) keeps on-policy accuracy at s=4"][0] == "reproduced"
    assert got["M2PO (all tokens) beats clipped GRPO at s=4"][0] == "reproduced"
    assert got["M2PO (trust-region tokens) keeps on-policy accuracy at s=4"] == (
        "pending",
        "waiting for m2po_tr s=4 (1 of 2 seeds), grpo_onpolicy s=0 (2 of 2 seeds)",
    )
    text = md.read_text()
    assert "| M2PO, all tokens | 4 | 2 of 2 | 85.0 ± 5.0 |" in text
    assert "| 0.40 ± 0.00 |" in text and "<!-- reading:start -->" in text
    assert "| M2PO, trust-region tokens | 16 | 0 of 2 | | | | | | | | |" in text
    # the hand-written reading survives a regeneration
    md.write_text(text.replace("(not written yet)", "my reading"))
    assert study.main(args) == 0
    assert "my reading" in md.read_text()


@pytest.mark.parametrize("round_name", ["2", "3", "4"])
def test_the_committed_reports_are_what_the_committed_runs_give(
    study, tmp_path, monkeypatch, round_name
):
    """The reports in docs/ regenerate byte for byte from research/stale_study/data/runs (into
    a copy of docs/, from the repository's root; the hand-written blocks are the committed
    report's)."""
    monkeypatch.chdir(REPO)  # the archive directory is named relative to the root
    report = load_round(round_name).report
    outputs = [name for name in ("md", "csv", "png", "round1_csv") if name in report]
    for name in ("md", "round1_csv"):
        if name in report:
            (tmp_path / report[name]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / report[name], tmp_path / report[name])
    flags = [f"--{name.replace('_', '-')}={tmp_path / report[name]}" for name in outputs]
    work = f"--work-dir={tmp_path / 'no_work_dir'}"
    args = study.parse_args([f"--round={round_name}", "--replot", work, *flags])
    # a round's own archive (round 4: runs of the same names as rounds 2-3, other sampler)
    own = load_round(round_name).settings.get("archive_dir")
    assert args.archive_dir == (own or "research/stale_study/data/runs")
    study.report(args, f"python -m research.stale_study --round {round_name} --replot")
    for name in ("md", "csv", "png"):
        if name in report and name != "png":
            assert (tmp_path / report[name]).read_bytes() == (REPO / report[name]).read_bytes()
        elif name in report:  # the figure: matplotlib's version may change the bytes
            assert (tmp_path / report[name]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_malformed_round_file_is_named_with_its_key(study, tmp_path):
    def bad(text: str, match: str) -> None:
        path = tmp_path / "round9.yaml"
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_round(str(path))

    bad("settngs: {}\n", r"round9\.yaml: unknown key\(s\) \['settngs'\]")
    claim = "claims:\n  - {claim: c, rule: %s, arm: %s%s}\n"
    bad(claim % ("wins", "m2po@s", ""), r"claims\[0\]\.rule: 'wins' not in")
    bad(claim % ("beats", "m2po@s", ""), r"claims\[0\]: rule beats needs baseline")
    bad(claim % ("beats", "m2po", ", baseline: grpo@s"), r"claims\[0\]\.arm: 'm2po' is not a cell")
    bad(claim % ("masked_below", "m2po@s", ""), r"claims\[0\]\.max_fraction: rule masked_below")
    bad("report: {sections: [tables]}\n", r"report\.sections\[0\]: kind not in")
    columns = "report: {sections: [{kind: results, columns: [{header: x}]}]}\n"
    bad(columns, r"report\.sections\[0\]\.columns\[0\]: needs a stat")
    with pytest.raises(ValueError, match=r"--round 9: .*round9\.yaml does not exist .*'round2'"):
        load_round("9")
    with pytest.raises(SystemExit):  # and on the command line, before anything runs
        study.parse_args(["--round=9"])
