"""A new user's next mistakes (issue 57), through the real entry points: the exit status and
the one printed line, or what the docs promise.

* a ``reward.model.path`` that is not a trained reward model (a policy's checkpoint, an SFT
  LoRA adapter) is refused before any model loads, naming the key; a saved reward model passes;
* ``overwrite_output_dir=true`` deletes the replaced run's saved models;
* ``scripts/eval_multi_turn.py``, ``scripts/gpu_check.sh`` and ``examples/slurm/train.sbatch``
  misused: one line (or the usage);
* ``rollout.agent.mode=subproc`` with a default ``openai.AsyncOpenAI()`` prints no "Event loop
  is closed" traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from procs import REPO, only_error_line, run_module, subprocess_env

TINY_RL = str(REPO / "configs" / "tiny.yaml")
TIMEOUT_S = 300


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


# ------------------------------------------------------------------------ reward.model.path
def _tiny_lm():
    from transformers import AutoModelForCausalLM

    from areal_m2po.engine.builtin_models import resolve_model_path

    return AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin:tiny"))


def _policy_checkpoint(folder: Path) -> Path:
    _tiny_lm().save_pretrained(folder, safe_serialization=True)
    return folder


def _sft_adapter(folder: Path) -> Path:
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(
        _tiny_lm(), LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM")
    )
    peft.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("make", [_policy_checkpoint, _sft_adapter])
def test_a_reward_model_path_without_a_trained_head_is_refused(tmp_path, make):
    """It trained PPO against a randomly initialised score head and exited 0."""
    model = make(tmp_path / "not_a_reward_model")
    out = tmp_path / "run"
    line = only_error_line(run_module("train", *_rl(out, f"reward.model.path={model}")))
    assert line.startswith(f"error: reward.model.path: {model} is not a reward model: "), line
    assert "train_rm" in line
    assert not out.exists()


def test_a_saved_reward_model_passes_the_head_check(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.reward.head_check import check_score_head

    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(
        resolve_model_path("builtin:tiny"), num_labels=1
    )
    rm.save_pretrained(tmp_path / "rm", safe_serialization=True)
    check_score_head("reward.model.path", str(tmp_path / "rm"))  # no error
    rm.save_pretrained(tmp_path / "rm_bin", safe_serialization=False)
    check_score_head("reward.model.path", str(tmp_path / "rm_bin"))


# -------------------------------------------------------------------- overwrite_output_dir
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


def test_overwrite_output_dir_deletes_the_replaced_runs_saved_models(tmp_path):
    """The replaced run's ``checkpoints/step_*`` (and ``final``) stayed beside the new run's
    metrics, passing for its models; other files there are the user's and stay."""
    out = tmp_path / "sft"
    first = run_module("train_sft", *_sft(out, "saver.freq_steps=1", "saver.save_at_end=true"))
    assert first.returncode == 0, first.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["final", "step_1", "step_2"]
    (out / "checkpoints" / "notes.txt").write_text("mine")
    args = _sft(out, "total_train_steps=1", "saver.save_at_end=false", "overwrite_output_dir=true")
    again = run_module("train_sft", *args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------------------------- scripts
def test_eval_multi_turn_with_a_missing_model_is_one_line(tmp_path):
    """It was transformers' 69-line traceback."""
    script = REPO / "scripts" / "eval_multi_turn.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--model", str(tmp_path / "nope")],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    line = only_error_line(proc)
    assert line.startswith(f"error: --model: {tmp_path / 'nope'} does not exist"), line


def _bash(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``bash <repo>/<script> *args`` without any SLURM_* variable, ``env`` added."""
    clean = {k: v for k, v in subprocess_env().items() if not k.startswith("SLURM_")}
    return subprocess.run(
        ["bash", str(REPO / script), *args], cwd=REPO, env={**clean, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_gpu_check_help_prints_its_usage():
    """``--help`` was taken for the output folder (and the checks ran)."""
    proc = _bash("scripts/gpu_check.sh", "--help", PYTHON="false", SKIP_BENCH="1", SKIP_TRAIN="1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("GPU check, for whenever one GPU is available")
    assert "scripts/gpu_check.sh [OUT_DIR]" in proc.stdout and "== environment" not in proc.stdout
    assert not (REPO / "--help").exists()
    wrong = _bash("scripts/gpu_check.sh", "--out", "x", PYTHON="false")
    assert wrong.returncode == 2 and wrong.stderr.startswith("gpu_check.sh: unknown option --out")


def test_the_slurm_script_outside_slurm_is_one_line():
    """It stopped on ``SLURM_JOB_ID: unbound variable``."""
    proc = _bash("examples/slurm/train.sbatch", "--config", "configs/tiny.yaml")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("train.sbatch: needs a Slurm job (SLURM_JOB_ID is not set): "), line
    assert "sbatch -N <nodes>" in line


# --------------------------------------------------------------------- rollout.agent subproc
def test_subproc_agents_with_the_default_client_print_no_event_loop_traceback(capfd):
    """One 22-line "Event loop is closed" traceback per episode: an unclosed client collected
    in a later episode's loop closed its connections on the earlier, closed one."""
    import asyncio

    from agentic_helpers import tiny_model_and_tokenizer
    from scripted_engine import ScriptOnlyEngine

    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.api.config.agent import AgentConfig
    from areal_m2po.api.engine_api import ModelResponse, SamplingParams
    from areal_m2po.api.workflow_api import WorkflowContext
    from areal_m2po.rollout.executor import arun_group
    from areal_m2po.rollout.workflows.agent.workflow import AgentWorkflow

    tokenizer = tiny_model_and_tokenizer()[1]

    class Answers(ScriptOnlyEngine):
        version = 0

        async def agenerate(self, request):  # type: ignore[no-untyped-def]
            ids = tokenizer("It is 1665.<|im_end|>", add_special_tokens=False)["input_ids"]
            n = len(ids)
            return ModelResponse(list(request.input_ids), ids, [-0.1] * n, [0] * n, "stop")

    g = GenerationConfig(n_samples=1, max_new_tokens=50)
    context = WorkflowContext(
        tokenizer, g, SamplingParams.from_gconfig(g), [tokenizer.eos_token_id], None,
        agent_config=AgentConfig(mode="subproc", subproc_max_workers=1),
    )  # fmt: skip
    workflow = AgentWorkflow(context, agent="toy_agents:DefaultClientAgent")
    record = {"question": "What is 37*45?", "answer": "1665"}
    try:
        for _ in range(3):  # one worker: episodes 2 and 3 collect the clients before them
            assert asyncio.run(arun_group(workflow, Answers(), record, 1, "agent")) is not None
    finally:
        workflow.close()
    err = capfd.readouterr().err
    assert "Event loop is closed" not in err and "Traceback" not in err, err[-3000:]
