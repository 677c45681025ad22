"""Recover checkpoints (exact resume after SIGKILL, epoch boundaries, atomic writes, corrupt or
mismatched checkpoints), SIGTERM, non-finite steps and hanging rewards, on the tiny model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from procs import SUPPORT, read_metrics, subprocess_env, untimed
from tiny_runs import make_cfg

from areal_m2po.api.cli_args import (
    DatasetConfig,
    RecoverConfig,
    RewardConfig,
    StatsLoggerConfig,
)
from areal_m2po.utils import recover

pytestmark = pytest.mark.usefixtures("restore_threads")


def run_cfg(cfg) -> int:
    from areal_m2po.trainer.rl_trainer import run

    return run(cfg)


class Crash(Exception):
    """Stands in for a crash inside the process."""


def crash_after_checkpoint(monkeypatch, step: int) -> None:
    """Make the run die (raise) right after its recover checkpoint of ``step`` is written."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    real = RLTrainer.save_checkpoint

    def save(trainer):
        path = real(trainer)
        if trainer.step >= step:
            raise Crash(f"crash after step {trainer.step}")
        return path

    monkeypatch.setattr(RLTrainer, "save_checkpoint", save)


# ------------------------------------------------------------------------------- exact resume
def test_sigkill_and_rerun_continues_bitwise(tmp_path):
    """4 steps straight == 2 steps, SIGKILL, rerun the same command (recover.mode=auto)."""
    from areal_m2po.api.config_loader import save_config

    crashed = make_cfg(tmp_path, "crashed", steps=4)
    cfg_file = save_config(crashed, tmp_path / "crashed.yaml")
    proc = subprocess.Popen(  # killed by SIGKILL right after its step-2 checkpoint
        [sys.executable, str(SUPPORT / "recover_worker.py"), str(cfg_file), "2"],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    straight = make_cfg(tmp_path, "straight", steps=4)  # meanwhile, in this process
    assert run_cfg(straight) == 0
    expected = read_metrics(straight.output_dir)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    root = recover.recover_root(crashed.output_dir)
    assert [s for s, _ in recover.list_checkpoints(root)] == [1, 2]
    assert [r["step"] for r in read_metrics(crashed.output_dir)] == [1, 2]

    assert run_cfg(crashed) == 0  # the same command again
    got = read_metrics(crashed.output_dir)
    assert [r["step"] for r in got] == [1, 2, 3, 4]  # no duplicate, no gap
    for a, b in zip(got, expected):
        assert untimed(a) == untimed(b), a["step"]  # bitwise: floats compared with ==
    # keep_last=2
    assert [s for s, _ in recover.list_checkpoints(root)] == [3, 4]


def test_resume_at_epoch_boundary(tmp_path, monkeypatch):
    """8 prompts, 4 per step, 2 epochs: a crash after step 2 (end of epoch 0) resumes into
    epoch 1 and trains exactly the 2 remaining steps, the same ones as a straight run."""
    kw = dict(
        steps=None,
        staleness=0,
        total_train_epochs=2,
        train_dataset=DatasetConfig(batch_size=4, max_samples=8),
    )
    straight = make_cfg(tmp_path, "straight", **kw)
    assert run_cfg(straight) == 0
    expected = read_metrics(straight.output_dir)
    assert [r["rollout/epoch"] for r in expected] == [0, 0, 1, 1]

    cfg = make_cfg(tmp_path, "crashed", **kw)
    with monkeypatch.context() as mp:
        crash_after_checkpoint(mp, 2)
        with pytest.raises(Crash):
            run_cfg(cfg)
    ckpt = torch.load(
        os.path.join(recover.recover_root(cfg.output_dir), "step_2", "trainer.pt"),
        weights_only=True,
    )
    assert (ckpt["loader"]["epoch"], ckpt["loader"]["position"]) == (0, 2)

    from areal_m2po.utils.stats_logger import StatsLogger

    steps_run = []
    real_log = StatsLogger.log

    def log(self, step, stats):
        steps_run.append(step)
        real_log(self, step, stats)

    monkeypatch.setattr(StatsLogger, "log", log)
    assert run_cfg(cfg) == 0
    assert steps_run == [3, 4]
    got = read_metrics(cfg.output_dir)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert [untimed(r) for r in got] == [untimed(r) for r in expected]


def test_checkpoint_with_the_old_behaviour_key_resumes_exactly(tmp_path, monkeypatch):
    """A checkpoint written before the batch key ``logprobs`` became ``behave_logp`` (its
    queued batches hold the old name) resumes into the same steps as a straight run."""
    straight = make_cfg(tmp_path, "straight", steps=3, staleness=2)
    assert run_cfg(straight) == 0
    cfg = make_cfg(tmp_path, "old_format", steps=3, staleness=2)
    with monkeypatch.context() as mp:
        crash_after_checkpoint(mp, 1)
        with pytest.raises(Crash):
            run_cfg(cfg)
    ranks_file = os.path.join(recover.recover_root(cfg.output_dir), "step_1", "ranks.pt")
    ranks = torch.load(ranks_file, weights_only=True)
    for batch, _ in ranks[0]["queue"]:
        batch["logprobs"] = batch.pop("behave_logp")  # the old layout
    torch.save(ranks, ranks_file)
    assert run_cfg(cfg) == 0
    got, expected = read_metrics(cfg.output_dir), read_metrics(straight.output_dir)
    assert [r["step"] for r in got] == [1, 2, 3]
    assert [untimed(r) for r in got] == [untimed(r) for r in expected]


def test_old_and_new_behaviour_keys_together_are_refused():
    from areal_m2po.utils.data import with_current_keys

    new = {"behave_logp": torch.zeros(1, 2)}
    assert with_current_keys(new) is new
    renamed = with_current_keys({"input_ids": torch.ones(1, 2), "logprobs": torch.ones(1, 2)})
    assert list(renamed) == ["input_ids", "behave_logp"]
    with pytest.raises(KeyError, match="'logprobs' and 'behave_logp'"):
        with_current_keys({"logprobs": torch.zeros(1), "behave_logp": torch.zeros(1)})


def test_crash_mid_write_leaves_previous_checkpoint(tmp_path, monkeypatch, capsys):
    cfg = make_cfg(tmp_path, steps=3, staleness=1)
    root = recover.recover_root(cfg.output_dir)
    real_write = recover._write

    def failing_write(obj, path):
        if f"{os.sep}.tmp-step_2-" in path and path.endswith("actor.pt"):
            raise OSError("disk full (test)")
        real_write(obj, path)

    with monkeypatch.context() as mp:
        mp.setattr(recover, "_write", failing_write)
        assert run_cfg(cfg) == 1  # the failed save: one line, the run stops
    err = capsys.readouterr().err
    assert "error: recover: a save into " in err and "(OSError: disk full (test))" in err
    assert [s for s, _ in recover.list_checkpoints(root)] == [1]
    # what a SIGKILL mid-write leaves behind: a partial temporary directory, and a directory
    # without meta.json; neither is ever taken for a checkpoint
    os.makedirs(os.path.join(root, ".tmp-step_2-deadbeef"))
    Path(root, ".tmp-step_2-deadbeef", "actor.pt").write_bytes(b"\x00" * 10)
    os.makedirs(os.path.join(root, "step_9"))
    assert recover.latest_checkpoint(root).endswith("step_1")

    assert run_cfg(cfg) == 0
    assert [r["step"] for r in read_metrics(cfg.output_dir)] == [1, 2, 3]
    assert not any(n.startswith(".tmp-") for n in os.listdir(root))


def test_resume_mode_without_checkpoint_fails_clearly(tmp_path, capsys):
    cfg = make_cfg(tmp_path, steps=1, recover=RecoverConfig(mode="resume"))
    assert run_cfg(cfg) == 2  # refused at start-up, before any model loads
    err = capsys.readouterr().err
    assert "recover.mode=resume" in err and "no recover checkpoint" in err
    assert recover.recover_root(cfg.output_dir) in err


def test_disabled_mode_writes_no_periodic_checkpoint_and_starts_fresh(tmp_path):
    cfg = make_cfg(tmp_path, steps=1, staleness=0)
    assert run_cfg(cfg) == 0
    root = recover.recover_root(cfg.output_dir)
    assert [s for s, _ in recover.list_checkpoints(root)] == [1]
    # another seed: loading that checkpoint would fail, so a clean run proves none was loaded
    cfg = make_cfg(tmp_path, steps=2, staleness=0, seed=6, recover=RecoverConfig(mode="disabled"))
    assert run_cfg(cfg) == 2  # the folder holds the first run: refused at start-up
    assert [s for s, _ in recover.list_checkpoints(root)] == [1]  # untouched
    cfg.overwrite_output_dir = True
    assert run_cfg(cfg) == 0
    assert [r["step"] for r in read_metrics(cfg.output_dir)] == [1, 2]
    assert recover.list_checkpoints(root) == []  # the replaced run's is deleted, none written


# ------------------------------------------------------------------- bad checkpoints
@pytest.fixture
def saved_checkpoint(tmp_path):
    cfg = make_cfg(tmp_path, "src", steps=1, staleness=1)
    assert run_cfg(cfg) == 0
    return cfg, recover.latest_checkpoint(recover.recover_root(cfg.output_dir))


def _copy_run(cfg, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(cfg.output_dir, dst)
    return make_cfg(tmp_path, name, steps=2, staleness=1), str(dst / "recover" / "step_1")


def test_corrupt_or_mismatched_checkpoint_names_the_file(tmp_path, saved_checkpoint, capsys):
    cfg, _ = saved_checkpoint

    # a truncated weights file
    new, ckpt = _copy_run(cfg, tmp_path, "truncated")
    data = Path(ckpt, "actor.pt").read_bytes()
    Path(ckpt, "actor.pt").write_bytes(data[: len(data) // 2])
    assert run_cfg(new) == 1
    err = capsys.readouterr().err
    assert os.path.join(ckpt, "actor.pt") in err and "corrupt" in err

    # weights of another architecture
    new, ckpt = _copy_run(cfg, tmp_path, "mismatch")
    state = torch.load(Path(ckpt, "actor.pt"), weights_only=True)
    state["model"] = {k + ".x": v for k, v in state["model"].items()}
    torch.save(state, Path(ckpt, "actor.pt"))
    assert run_cfg(new) == 1
    err = capsys.readouterr().err
    assert os.path.join(ckpt, "actor.pt") in err and "does not match" in err

    # a different run (batch size) and a different number of processes
    new, ckpt = _copy_run(cfg, tmp_path, "other_run")
    new.train_dataset.batch_size = 8
    assert run_cfg(new) == 2  # meta.json is checked at start-up
    err = capsys.readouterr().err
    # a key no resume may change (trainer/resume_check.py): the checkpoint and the key named
    assert ckpt in err and "train_dataset.batch_size" in err

    new, ckpt = _copy_run(cfg, tmp_path, "world")
    meta = json.loads(Path(ckpt, "meta.json").read_text())
    meta["world_size"] = 2
    Path(ckpt, "meta.json").write_text(json.dumps(meta))
    assert run_cfg(new) == 2
    err = capsys.readouterr().err
    assert os.path.join(ckpt, "meta.json") in err and "2 processes" in err


def test_rng_roundtrip():
    import random

    import numpy as np

    state = recover.capture_rng()
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.random(), np.random.rand(), torch.rand(1)
    recover.restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == a


# ----------------------------------------------------------------------------------- SIGTERM
def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path):
    """SIGTERM: a recover checkpoint after the current step, one line saying how to continue,
    and the status of a process ended by SIGTERM (the run is not finished)."""
    from areal_m2po.api.config_loader import save_config

    cfg = make_cfg(tmp_path, steps=500, recover=RecoverConfig(mode="auto", freq_steps=1000))
    cfg_file = save_config(cfg, tmp_path / "run.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_m2po.train", "--config", str(cfg_file)],
        env=subprocess_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = Path(cfg.output_dir, "metrics.jsonl")
    deadline = time.time() + 180
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.time() < deadline, "no step finished in time"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    steps = [r["step"] for r in read_metrics(cfg.output_dir)]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) < 500
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: stopped by SIGTERM after step {steps[-1]} of 500; its recover checkpoint is in "
        f"{recover.recover_root(cfg.output_dir)}: rerun with recover.mode=auto to continue"
    ]
    found = recover.list_checkpoints(recover.recover_root(cfg.output_dir))
    assert [s for s, _ in found] == [steps[-1]]  # the step it stopped after
    assert "SIGTERM" in err
    assert not os.path.exists(os.path.join(cfg.output_dir, "checkpoints", "final"))


# ------------------------------------------------------------------------------------ faults
def test_consecutive_nonfinite_steps_stop_the_run(tmp_path, monkeypatch, capsys):
    """NaN losses at steps 2, 4 and 5: step 2 is skipped and counted, step 3 trains again,
    the second skip in a row (step 5) stops the run; the last checkpoint is step 3's."""
    from areal_m2po.trainer.ppo.actor import PPOActor

    bad_versions = {1, 3, 4}  # engine.version is the 0-based step index
    real = PPOActor._microbatch_loss

    def nan_loss(self, logp, entropy, mb, step_in_update):
        loss, stats = real(self, logp, entropy, mb, step_in_update)
        if self.engine.version in bad_versions:
            loss = loss * float("nan")
        return loss, stats

    monkeypatch.setattr(PPOActor, "_microbatch_loss", nan_loss)
    cfg = make_cfg(tmp_path, steps=8, staleness=0)
    cfg.actor.max_consecutive_skipped_steps = 2
    assert run_cfg(cfg) == 1
    err = capsys.readouterr().err
    assert "max_consecutive_skipped_steps=2" in err and "step_3" in err
    records = read_metrics(cfg.output_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["actor/skipped_steps"] for r in records] == [0, 1, 0, 1, 1]
    root = recover.recover_root(cfg.output_dir)
    assert [s for s, _ in recover.list_checkpoints(root)] == [1, 3]  # none after a bad step
    # the last good checkpoint is intact: a rerun without the fault continues from step 3
    monkeypatch.setattr(PPOActor, "_microbatch_loss", real)
    cfg.total_train_steps = 4
    assert run_cfg(cfg) == 0
    records = read_metrics(cfg.output_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["actor/skipped_steps"] == 0


def test_hanging_reward_scores_zero_after_timeout(tmp_path):
    cfg = make_cfg(
        tmp_path,
        steps=1,
        staleness=0,
        reward=RewardConfig(path="toy_rewards:hanging_reward", timeout_s=0.2, max_workers=16),
        recover=RecoverConfig(mode="disabled"),
    )
    assert run_cfg(cfg) == 0
    (r,) = read_metrics(cfg.output_dir)
    assert r["reward/n_timeouts"] == 16 and r["reward/mean"] == 0.0


@pytest.mark.slow
def test_resumed_run_continues_the_same_wandb_run(tmp_path):
    from areal_m2po.api.cli_args import WandBConfig

    logger_cfg = StatsLoggerConfig(progress_bar=False, wandb=WandBConfig(mode="offline"))
    cfg = make_cfg(tmp_path, steps=1, staleness=0, stats_logger=logger_cfg)
    assert run_cfg(cfg) == 0
    cfg.total_train_steps = 2
    assert run_cfg(cfg) == 0
    run_id = Path(cfg.output_dir, "wandb_run_id.txt").read_text().strip()
    runs = sorted(p.name for p in Path(cfg.output_dir, "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith("-" + run_id) for name in runs)
    assert [r["step"] for r in read_metrics(cfg.output_dir)] == [1, 2]
