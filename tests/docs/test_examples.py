"""Every script in examples/ runs at tiny size and says what it claims.

Training examples run in-process through their ``main(argv)`` (``--tiny``: the built-in tiny
model, 2 steps, a temporary output directory); the import-path-sensitive ones also run as real
scripts in a subprocess, the way a user starts them.
"""

from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from areal_m2po.api.cli_args import ActorConfig, ConfigError
from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def load_example(name: str) -> dict[str, Any]:
    """The globals of ``examples/<name>.py`` (its ``main`` is not run)."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name=f"example_{name}")


def run_script(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None):
    env = dict(os.environ, **(extra_env or {}))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    with open(Path(run_dir) / "metrics.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---------------------------------------------------------------------------------------------
# inspect_m2po_mask.py
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [0.05, 0.01, 1e-6, 10.0])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_inspect_m2po_mask_matches_library(seed, threshold, capsys):
    ex = load_example("inspect_m2po_mask")
    result = ex["main"](["--seed", str(seed), "--threshold", str(threshold)])
    out = capsys.readouterr().out

    behave_logp, prox_logp = ex["toy_logprobs"](seed)
    assert behave_logp.shape == (2, 8)
    full = torch.ones(2, 8, dtype=torch.bool)
    keep = _apply_m2po_masking(behave_logp, prox_logp, full, m2_threshold=threshold)
    assert result["original_tokens"] == 16
    assert result["filtered_tokens"] == int(keep.sum())
    assert sorted(result["masked_positions"]) == sorted(map(tuple, (~keep).nonzero().tolist()))
    assert result["agrees_with_library"] is True
    assert "original token count (loss_mask):        16" in out
    assert f"filtered token count (after M2PO):       {int(keep.sum())}" in out

    # the explanation: dropped in decreasing m2, each while the running mean was >= threshold
    steps = result["steps"]
    assert len(steps) == 16 - int(keep.sum())
    m2s = [s["m2"] for s in steps]
    assert m2s == sorted(m2s, reverse=True)
    for i, s in enumerate(steps):
        assert s["running_mean"] >= threshold
        assert s["tokens_in"] == 16 - i
        assert f"masked (row {s['row']}, col {s['col']})" in out
    m2 = (behave_logp - prox_logp).pow(2)
    assert math.isclose(result["mean_m2_after"], float(m2[keep].double().mean()), rel_tol=1e-5)
    if int(keep.sum()) > 1:
        assert result["mean_m2_after"] < threshold
        # every masked token has an m2 at least as large as every kept one
        if steps:
            assert float(m2[~keep].min()) >= float(m2[keep].max())


def test_inspect_m2po_mask_script_masks_something_by_default():
    proc = run_script([str(EXAMPLES / "inspect_m2po_mask.py"), "--json"], cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["threshold"] == 0.05
    assert data["original_tokens"] == 16
    assert 0 < len(data["masked_positions"]) < 16  # the default shows the rule doing something
    assert data["filtered_tokens"] == 16 - len(data["masked_positions"])
    assert data["agrees_with_library"] is True


# ---------------------------------------------------------------------------------------------
# programmatic_config.py
# ---------------------------------------------------------------------------------------------


def test_programmatic_config_layers_python_yaml_and_overrides_then_trains(tmp_path, capsys):
    ex = load_example("programmatic_config")
    out_dir = tmp_path / "run"
    result = ex["main"](["--tiny", "--output-dir", str(out_dir), "actor.optimizer.lr=3e-4"])
    out = capsys.readouterr().out
    assert result["status"] == 0
    cfg = result["config"]
    # Python layer
    assert cfg.actor.m2_threshold == 0.05
    assert cfg.actor.eps_clip == 0.2
    assert cfg.actor.use_sapo_loss is False
    assert cfg.actor.path == "builtin:tiny"
    # YAML layer over Python, override over both
    assert cfg.experiment_name == "programmatic-example"
    assert cfg.rollout.staleness == 1
    assert cfg.actor.optimizer.lr == 3e-4
    assert "actor.m2_threshold   = 0.05" in out and "(Python" in out
    assert "rollout.staleness    = 1" in out and "(YAML)" in out
    assert "(command-line override)" in out
    # it trained: two steps with M2PO diagnostics at the Python threshold
    records = [r for r in result["metrics"] if "m2po/masked_fraction" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["m2po/threshold"] == 0.05
        assert math.isfinite(r["actor/loss"])
    assert "step 2: reward/mean=" in out
    # the resolved config of the run is the layered one
    import yaml

    saved = yaml.safe_load((out_dir / "config.yaml").read_text())
    assert saved["actor"]["m2_threshold"] == 0.05 and saved["rollout"]["staleness"] == 1


def test_programmatic_config_rejects_a_bad_override_before_training(tmp_path):
    ex = load_example("programmatic_config")
    with pytest.raises(ConfigError, match="actor.eps_clip"):
        ex["main"](["--tiny", "--output-dir", str(tmp_path / "run"), "actor.eps_clip=-1"])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# custom_reward.py / custom_reward.yaml / my_reward.py
# ---------------------------------------------------------------------------------------------


def test_my_reward_function_values(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from my_reward import closeness_reward

    assert closeness_reward("59 + 63?", "The answer is 122", "122") == 1.0
    assert closeness_reward("", "121", "122") == pytest.approx(0.5 * (1 - 1 / 122))
    assert closeness_reward("", "no number here", "122") == 0.0
    assert closeness_reward("", "-500", "122") == 0.0
    assert closeness_reward("", "#### 72", "Natalia sold ... #### 72") == 1.0


def test_custom_reward_run_logs_the_custom_functions_rewards(tmp_path, monkeypatch, capsys):
    """The YAML's dotted path reaches examples/my_reward.py and its values are the logged reward."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import my_reward

    original = my_reward.closeness_reward
    calls: list[float] = []

    def recording(prompt, completion, answer, **extra):
        value = original(prompt, completion, answer, **extra)
        calls.append(value)
        return value

    monkeypatch.setattr(my_reward, "closeness_reward", recording)
    ex = load_example("custom_reward")
    out_dir = tmp_path / "run"
    result = ex["main"](["--tiny", "--output-dir", str(out_dir)])
    out = capsys.readouterr().out
    assert result["status"] == 0
    records = [r for r in result["metrics"] if "reward/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    per_step = 4 * 4  # train_dataset.batch_size x gconfig.n_samples, no evaluation
    # with rollout.staleness = s the trainer generates s batches ahead of the one it trains
    import yaml

    staleness = yaml.safe_load((out_dir / "config.yaml").read_text())["rollout"]["staleness"]
    assert len(calls) == (2 + staleness) * per_step
    for i, r in enumerate(records):
        batch = calls[i * per_step : (i + 1) * per_step]
        assert r["reward/mean"] == pytest.approx(sum(batch) / per_step, abs=1e-6)
        assert r["reward/n_errors"] == 0
    import yaml

    saved = yaml.safe_load((out_dir / "config.yaml").read_text())
    assert saved["reward"]["path"] == "my_reward:closeness_reward"
    assert "reward logged per step (from my_reward:closeness_reward)" in out


def test_custom_reward_script_runs_from_any_directory(tmp_path):
    """As a script, Python puts examples/ on sys.path: no PYTHONPATH needed."""
    out_dir = tmp_path / "run"
    proc = run_script(
        [str(EXAMPLES / "custom_reward.py"), "--tiny", "--output-dir", str(out_dir)], cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step 2: reward/mean=" in proc.stdout
    records = read_metrics(out_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["reward/n_errors"] == 0 for r in records)


def test_custom_reward_yaml_with_the_documented_command_line():
    """``PYTHONPATH=examples python -m areal_m2po.train --config examples/custom_reward.yaml``."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, ["examples", os.environ.get("PYTHONPATH")]))}
    proc = run_script(
        ["-m", "areal_m2po.train", "--config", "examples/custom_reward.yaml", "--print-config"],
        cwd=REPO,
        extra_env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "path: my_reward:closeness_reward" in proc.stdout
    probe = (
        "from areal_m2po.reward import load_reward_fn; "
        "print(load_reward_fn('my_reward:closeness_reward')('', '122', '122'))"
    )
    proc = run_script(["-c", probe], cwd=REPO, extra_env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1.0"


# ---------------------------------------------------------------------------------------------
# custom_loss.py
# ---------------------------------------------------------------------------------------------


def _hand_batch() -> dict[str, torch.Tensor]:
    """One row, 4 positions: 3 valid tokens, M2PO drops the second, advantage 2."""
    return {
        "loss_mask": torch.tensor([[True, True, True, False]]),
        "m2po_mask": torch.tensor([[True, False, True, True]]),
        "advantages": torch.tensor([[2.0, 2.0, 2.0, 0.0]]),
        # token 0: weight exp(0) = 1; token 2: exp(ln 3) = 3, truncated to 2
        "prox_logp": torch.tensor([[-1.0, -2.0, -0.5 - math.log(3.0), 0.0]]),
        "behave_logp": torch.tensor([[-1.2, -2.5, -1.0, 0.0]]),
    }


def test_custom_loss_value_and_gradient_by_hand():
    ex = load_example("custom_loss")
    ctx = ex["LossContext"](ActorConfig(m2_threshold=0.05), max_new_tokens=4)
    logp = torch.tensor([[-1.0, -2.0, -0.5, 0.0]], requires_grad=True)
    loss, stats = ex["truncated_reinforce_loss"](logp, torch.zeros(1, 4), _hand_batch(), ctx)
    # -(1 * 2 * -1.0 + 2 * 2 * -0.5) / 3 valid tokens; token 1 masked by M2PO, token 3 invalid
    assert float(loss.detach()) == pytest.approx(4.0 / 3.0, rel=1e-6)
    loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[-2.0 / 3.0, 0.0, -4.0 / 3.0, 0.0]]))
    assert float(stats["reinforce/kept_fraction"]) == pytest.approx(2.0 / 3.0)
    assert float(stats["reinforce/truncated_fraction"]) == pytest.approx(1.0 / 3.0)
    # without M2PO (no m2po_mask in the batch) every valid token counts
    batch = _hand_batch()
    del batch["m2po_mask"]
    loss, _ = ex["truncated_reinforce_loss"](logp.detach(), torch.zeros(1, 4), batch, ctx)
    assert float(loss) == pytest.approx((2.0 + 4.0 + 2.0) / 3.0, rel=1e-6)
    bad = ex["LossContext"](ActorConfig(loss_agg_mode="seq-mean-token-mean"), max_new_tokens=4)
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        ex["truncated_reinforce_loss"](logp, torch.zeros(1, 4), _hand_batch(), bad)


def test_custom_loss_example_trains_through_the_config_seam(tmp_path, capsys):
    ex = load_example("custom_loss")
    result = ex["main"](["--tiny", "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    assert result["config"].actor.loss_fn == "custom_loss:truncated_reinforce_loss"
    records = [r for r in result["metrics"] if "actor/loss" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["actor/loss"])
        assert "actor/clip_fraction" not in r  # the library loss did not run
        # the loss saw the actor's M2PO mask: it kept exactly the tokens M2PO did not mask
        assert r["reinforce/kept_fraction"] == pytest.approx(1 - r["m2po/masked_fraction"])
    # staleness 1: step 2 trains on the previous policy's samples, and M2PO masks some
    assert records[1]["m2po/masked_fraction"] > 0
    # the step callback saw every phase of both steps, in order
    order = ["generate", "prox", "ref", "advantages", "m2po", "update", "sync"]
    for step in (1, 2):
        assert [name for s, name in result["phases"] if s == step] == order
    assert "actor.loss_fn=custom_loss:truncated_reinforce_loss" in out


# ---------------------------------------------------------------------------------------------
# custom_workflow.py
# ---------------------------------------------------------------------------------------------


def test_custom_workflow_example_trains_through_the_config_seam(tmp_path, capsys):
    ex = load_example("custom_workflow")
    result = ex["main"](["--tiny", "--output-dir", str(tmp_path / "run"), "--bonus", "0.5"])
    out = capsys.readouterr().out
    cfg = result["config"]
    assert cfg.rollout.workflow == "custom_workflow:FormatBonusWorkflow"
    assert cfg.rollout.workflow_kwargs == {"format_bonus": 0.5}
    rows = [r for r in result["metrics"] if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    n = cfg.train_dataset.batch_size * cfg.gconfig.n_samples
    for r in rows:
        kept = n - r["rollout/n_dropped_groups"] * cfg.gconfig.n_samples
        assert 0 <= r["workflow/format_hits"] <= kept
        # closeness_reward is in [0, 1]: the mean holds at least the bonus of every hit
        assert r["reward/mean"] * kept >= 0.5 * r["workflow/format_hits"] - 1e-6
        assert f"workflow/format_hits={r['workflow/format_hits']:.0f}" in out


def test_custom_workflow_example_scores_and_drops_by_hand():
    import asyncio

    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.api.engine_api import InferenceEngine, ModelResponse, SamplingParams
    from areal_m2po.api.workflow_api import WorkflowContext
    from areal_m2po.reward.runner import RewardRunner
    from areal_m2po.rollout.executor import arun_group
    from areal_m2po.rollout.rewards import RewardSources

    class Tok:  # token t decodes to chr(t)
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(t) for t in ids)

    class Scripted(InferenceEngine):
        def __init__(self, outputs):
            self.outputs = list(outputs)

        async def agenerate(self, request):
            out = self.outputs.pop(0)
            return ModelResponse(request.input_ids, out, [0.0] * len(out), [0] * len(out), "stop")

        def update_weights_from_tensors(self, named_tensors, version): ...
        def update_weights_from_disk(self, path, version): ...
        def pause(self): ...
        def resume(self): ...
        def get_version(self):
            return 0

        def set_version(self, version): ...

    def answer_is_7(prompt, completion, answer, **kw):
        return 1.0 if completion == answer else 0.0

    ex = load_example("custom_workflow")
    g = GenerationConfig(n_samples=3, max_new_tokens=4)
    with RewardRunner(answer_is_7, 10, 1) as runner:
        ctx = WorkflowContext(Tok(), g, SamplingParams.from_gconfig(g), [0], RewardSources(runner))
        wf = ex["FormatBonusWorkflow"](ctx, format_bonus=0.25)
        record = {"prompt_ids": [1], "prompt_text": "p", "answer": "7", "question": "q"}
        outs = [[ord("7"), 0], [ord("x"), 0], [ord("3"), ord("y"), 0]]
        group = asyncio.run(arun_group(wf, Scripted(outs), record, 3))
        assert group.rewards == [1.25, 0.0, 0.25]
        assert group.stats["workflow/format_hits"] == 2
        same = asyncio.run(arun_group(wf, Scripted([[ord("a"), 0]] * 3), record, 3))
        assert same is None  # identical completions: dropped
