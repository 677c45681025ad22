"""Resumable scheduling of the study's runs through ``python -m areal_m2po.train``.

A run is started with ``recover.mode=auto`` and a recover checkpoint every few updates
(``keep_last`` 1), so a run that was killed (the machine rebooted, the session ended) continues
from its last checkpoint when the study is started again with the same ``--work-dir``. A run
that finished is marked ``done.json``; its recover checkpoints are deleted and its small files
copied to the archive directory (see :mod:`.runs`), and it is never run again.
"""

from __future__ import annotations

import json
import os
import queue
import resource
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .arms import Arm
from .runs import (
    DONE_FILE,
    RUN_INFO_FILE,
    RunKey,
    archive_run,
    finished_dir,
    reached_end,
    run_times,
)


@dataclass
class RunSpec:
    """One run: its key, its working directory and its full list of config overrides."""

    key: RunKey
    run_dir: str
    overrides: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.key.name


@dataclass(frozen=True)
class Settings:
    """What every run of one study invocation shares (from the CLI and arms.yaml)."""

    model: str
    dtype: str
    train_dataset: str
    valid_dataset: str
    valid_split: str
    reward: str
    steps: int
    batch_size: int
    n_samples: int
    max_new_tokens: int
    lr: float
    eval_size: int
    eval_batch_size: int
    eval_every: int
    threads: int | None
    recover_every: int
    extra: tuple[str, ...] = ()


def common_overrides(st: Settings) -> list[str]:
    """Config keys every run shares: model, task, budget, evaluation, and the disk policy
    (no HF saves; recover checkpoints every ``recover_every`` updates, only the last kept)."""
    ov = [
        "experiment_name=stale_study",
        f"actor.path={st.model}",
        f"actor.dtype={st.dtype}",
        f"actor.optimizer.lr={st.lr}",
        "actor.optimizer.lr_scheduler_type=constant",
        "actor.ppo_n_minibatches=1",
        "actor.kl_ctl=0.0",
        "actor.skip_zero_adv_seqs=true",
        "actor.adv_norm_weighting=sequence",
        "actor.loss_agg_mode=token-mean",
        f"total_train_steps={st.steps}",
        f"train_dataset.path={st.train_dataset}",
        f"train_dataset.batch_size={st.batch_size}",
        f"valid_dataset.path={st.valid_dataset}",
        f"valid_dataset.split={st.valid_split}",
        f"valid_dataset.max_samples={st.eval_size}",
        f"valid_dataset.batch_size={min(st.eval_size, st.eval_batch_size)}",
        "valid_dataset.shuffle=false",
        f"gconfig.n_samples={st.n_samples}",
        f"gconfig.max_new_tokens={st.max_new_tokens}",
        "gconfig.temperature=1.0",
        f"reward.path={st.reward}",
        f"evaluator.freq_steps={st.eval_every}",
        "evaluator.eval_at_start=true",
        "evaluator.eval_at_end=true",
        "saver.save_at_end=false",
        "saver.freq_steps=null",
        "recover.mode=auto",
        f"recover.freq_steps={st.recover_every}",
        "recover.keep_last=1",
        "stats_logger.progress_bar=false",
    ]
    if st.threads:
        ov.append(f"num_threads={st.threads}")
    return ov


def plan_pilot(
    arms: Sequence[Arm],
    staleness: int,
    seeds: Sequence[int],
    pilot_arm: Arm | None,
    pilot_staleness: Sequence[int],
) -> list[tuple[Arm, RunKey]]:
    """The staleness pilot: the on-policy arms and ``pilot_arm`` at each ``pilot_staleness``
    (the study's s first when it is one of them), all on the first seed."""
    if pilot_arm is None or not pilot_staleness or not seeds:
        return []
    on_policy = [(a, RunKey(a.name, 0, seeds[0])) for a in arms if a.staleness == "on_policy"]
    values = sorted(pilot_staleness, key=lambda s: s != staleness)
    return on_policy + [(pilot_arm, RunKey(pilot_arm.name, s, seeds[0])) for s in values]


def plan(
    arms: Sequence[Arm],
    staleness: int,
    seeds: Sequence[int],
    pilot_arm: Arm | None = None,
    pilot_staleness: Sequence[int] = (),
) -> list[tuple[Arm, RunKey]]:
    """The runs in the order they start: the staleness pilot, then (with a pilot) the on-policy
    arms' other seeds, which do not depend on s, then the study seed by seed."""
    order = plan_pilot(arms, staleness, seeds, pilot_arm, pilot_staleness)
    if order:
        on_policy = [a for a in arms if a.staleness == "on_policy"]
        order += [(a, RunKey(a.name, 0, seed)) for seed in seeds[1:] for a in on_policy]
    order += [(a, RunKey(a.name, a.staleness_at(staleness), seed)) for seed in seeds for a in arms]
    unique: dict[str, tuple[Arm, RunKey]] = {}
    for arm, key in order:
        unique.setdefault(key.name, (arm, key))
    return list(unique.values())


def build_specs(st: Settings, runs: Sequence[tuple[Arm, RunKey]], work_dir: str) -> list[RunSpec]:
    """One spec per planned run, in order, training into ``work_dir/<name>``."""
    specs = []
    for arm, key in runs:
        run_dir = os.path.join(work_dir, key.name)
        ov = [
            *common_overrides(st),
            *arm.overrides,
            f"rollout.staleness={key.staleness}",
            f"seed={key.seed}",
            f"trial_name={key.name}",
            f"output_dir={run_dir}",
            *st.extra,
        ]
        specs.append(RunSpec(key, run_dir, ov))
    return specs


def code_commit() -> str:
    """``git rev-parse HEAD`` of the code that runs (with ``+dirty`` for local changes)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def worker_env(threads: int | None, devices: str | None = None) -> dict[str, str]:
    """The environment of a run's process: this process's import paths, fixed threads."""
    env = dict(os.environ)
    prefixes = tuple({sys.prefix, sys.base_prefix})
    paths = [os.getcwd(), *[p for p in sys.path if p and not p.startswith(prefixes)]]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env["MKL_NUM_THREADS"] = str(threads)
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    for name, value in (
        ("TOKENIZERS_PARALLELISM", "false"),
        ("HF_HUB_OFFLINE", "1"),
        ("HF_DATASETS_OFFLINE", "1"),
    ):
        env.setdefault(name, value)
    return env


def train_command(spec: RunSpec, launcher: str = "") -> list[str]:
    """``python -m areal_m2po.train KEY=VALUE ...``, or ``LAUNCHER -m areal_m2po.train ...``
    (e.g. ``accelerate launch --num_processes 4``) for multi-GPU runs."""
    head = shlex.split(launcher) if launcher else [sys.executable]
    return [*head, "-m", "areal_m2po.train", *spec.overrides]


def device_slots(n_slots: int, per_run: int, visible: str | None) -> list[str | None]:
    """One CUDA_VISIBLE_DEVICES value per concurrent run: consecutive blocks of ``per_run``
    devices out of ``visible`` (default 0..n_slots*per_run-1); all None when per_run is 0."""
    if per_run <= 0:
        return [None] * n_slots
    ids = [d.strip() for d in visible.split(",")] if visible else None
    ids = ids or [str(i) for i in range(n_slots * per_run)]
    if len(ids) < n_slots * per_run:
        raise ValueError(
            f"{n_slots} parallel runs x {per_run} devices need {n_slots * per_run} devices, "
            f"{len(ids)} visible"
        )
    return [",".join(ids[i * per_run : (i + 1) * per_run]) for i in range(n_slots)]


def _record_attempt(run_dir: str, attempt: dict[str, Any]) -> dict[str, Any]:
    """Add or update the current attempt in ``study_run.json``; the file's new content."""
    path = os.path.join(run_dir, RUN_INFO_FILE)
    info: dict[str, Any] = {"attempts": []}
    if os.path.exists(path):
        with open(path) as fh:
            info = json.load(fh)
    attempts = [a for a in info.get("attempts", []) if a.get("start") != attempt["start"]]
    info["attempts"] = [*attempts, attempt]
    times = run_times(info["attempts"])  # the report's rule; None while unknown
    info["wall_s"] = round(times["wall_s"], 1) if times else None
    info["cpu_s"] = round(times["cpu_s"], 1) if times else None
    info["command"] = attempt["command"]
    with open(path + ".tmp", "w") as fh:
        json.dump(info, fh, indent=1)
    os.replace(path + ".tmp", path)
    return info


def _resume_step(run_dir: str) -> int:
    from areal_m2po.utils.recover import list_checkpoints, recover_root

    found = list_checkpoints(recover_root(run_dir))
    return found[-1][0] if found else 0


def _train(
    cmd: list[str], spec: RunSpec, in_process: bool, env: dict[str, str]
) -> tuple[int, float]:
    """(exit status, CPU seconds) of one training attempt.

    The CPU time (user + system of the run's process, or of this process in-process) does not
    grow when other jobs share the cores, so with one thread per run it estimates the run's
    wall time on an idle machine."""
    if in_process:
        from areal_m2po.api.config_loader import load_config
        from areal_m2po.trainer.rl_trainer import run

        before = resource.getrusage(resource.RUSAGE_SELF)
        rc = int(run(load_config(list(spec.overrides))) or 0)
        after = resource.getrusage(resource.RUSAGE_SELF)
        return rc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(os.path.join(spec.run_dir, "train.log"), "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # the rusage of this child alone
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def execute(spec: RunSpec, steps: int, opts: RunOptions, devices: str | None = None) -> int:
    """Train (or continue) one run in ``spec.run_dir``; mark it done when its last evaluation
    is logged, then delete its recover checkpoints and archive it. Returns the exit status."""
    os.makedirs(spec.run_dir, exist_ok=True)
    cmd = train_command(spec, opts.launcher)
    attempt: dict[str, Any] = {
        "command": shlex.join(cmd),
        "commit": opts.commit,
        "start": time.time(),
        "resumed_from_step": _resume_step(spec.run_dir),
    }
    if devices is not None:
        attempt["cuda_visible_devices"] = devices
    _record_attempt(spec.run_dir, attempt)
    t0 = time.perf_counter()
    rc, cpu_s = _train(cmd, spec, opts.in_process, worker_env(opts.threads, devices))
    attempt.update(rc=rc, wall_s=round(time.perf_counter() - t0, 1), end=time.time())
    attempt["cpu_s"] = round(cpu_s, 1)
    info = _record_attempt(spec.run_dir, attempt)
    if rc == 0 and reached_end(spec.run_dir, steps):
        done = {"steps": steps, "wall_s": info["wall_s"], "cpu_s": info["cpu_s"]}
        done["commit"] = opts.commit
        done.update(attempts=len(info["attempts"]), finished=time.time())
        with open(os.path.join(spec.run_dir, DONE_FILE), "w") as fh:
            json.dump(done, fh, indent=1)
        shutil.rmtree(os.path.join(spec.run_dir, "recover"), ignore_errors=True)
        if opts.archive_dir:
            archive_run(spec.run_dir, opts.archive_dir)
    elif rc == 0:
        rc = 1  # exited cleanly without the final evaluation: not a finished run
    return rc


@dataclass(frozen=True)
class RunOptions:
    """How runs are started: in this process or not, launcher, threads, archive, commit."""

    in_process: bool = False
    launcher: str = ""
    threads: int | None = 1
    archive_dir: str = ""
    commit: str = "unknown"
    parallel: int = 2
    devices_per_run: int = 0


def pending(specs: Sequence[RunSpec], archive_dir: str, steps: int, force: bool) -> list[RunSpec]:
    """The specs still to run; finished runs are skipped (``force``: rerun them from scratch).

    Raises:
        ValueError: a finished run of the same name was planned for another number of updates
            (a different study: give it its own ``--work-dir`` and ``--archive-dir``).
    """
    todo = []
    for spec in specs:
        done_at = finished_dir(spec.key, archive_dir, os.path.dirname(spec.run_dir))
        if done_at and not force:
            with open(os.path.join(done_at, DONE_FILE)) as fh:
                done_steps = json.load(fh).get("steps")
            if done_steps != steps:
                raise ValueError(
                    f"{done_at}/{DONE_FILE}: finished with {done_steps} updates, this study "
                    f"plans {steps}; use another --work-dir and --archive-dir (or --force)"
                )
            print(f"[stale_study] {spec.name}: finished ({done_at}), skipped", flush=True)
            continue
        if force and os.path.isdir(spec.run_dir):
            shutil.rmtree(spec.run_dir)
        todo.append(spec)
    return todo


def run_all(specs: Sequence[RunSpec], steps: int, opts: RunOptions) -> dict[str, int]:
    """Run ``specs`` (already filtered by :func:`pending`), ``opts.parallel`` at a time."""
    status: dict[str, int] = {}
    slots: queue.Queue[str | None] = queue.Queue()
    for slot in device_slots(
        opts.parallel, opts.devices_per_run, os.environ.get("CUDA_VISIBLE_DEVICES")
    ):
        slots.put(slot)

    def one(spec: RunSpec) -> None:
        devices = slots.get()
        print(f"[stale_study] start {spec.name}", flush=True)
        t0 = time.perf_counter()
        try:
            rc = execute(spec, steps, opts, devices)
        except Exception as exc:  # one failed arm must not lose the others
            print(f"[stale_study] {spec.name} failed: {type(exc).__name__}: {exc}", flush=True)
            rc = 1
        finally:
            slots.put(devices)
        status[spec.name] = rc
        dt = time.perf_counter() - t0
        print(f"[stale_study] done {spec.name}: rc={rc} in {dt:.0f}s", flush=True)

    _map(one, specs, 1 if opts.in_process else opts.parallel)
    return status


def _map(fn: Callable[[RunSpec], None], specs: Sequence[RunSpec], workers: int) -> None:
    if workers == 1:
        for spec in specs:
            fn(spec)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(fn, specs))
