"""Every script in examples/ runs at tiny size and says what it claims.

Training examples run in-process through their ``main(argv)`` (``--tiny``: the built-in tiny
model, 2 steps, a temporary output directory); the import-path-sensitive ones also run as real
scripts in a subprocess, the way a user starts them.
"""

from __future__ import annotations

import functools
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

from areal_m2po.api.cli_args import ActorConfig, ConfigError, RejectionSamplingConfig
from areal_m2po.trainer.ppo.actor import PPOActor, _apply_m2po_masking, global_m2po_mask

REPO = Path(__file__).resolve().parents[1]
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

    old_logp, prox_logp = ex["toy_logprobs"](seed)
    assert old_logp.shape == (2, 8)
    full = torch.ones(2, 8, dtype=torch.bool)
    keep = _apply_m2po_masking(old_logp, prox_logp, full, m2_threshold=threshold)
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
    m2 = (old_logp - prox_logp).pow(2)
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

LOSS_VARIANTS = {
    "ppo": dict(),
    "ppo-clip-higher-dual-clip": dict(eps_clip_higher=0.28, c_clip=3.0),
    "sapo": dict(use_sapo_loss=True),
    "decoupled": dict(use_decoupled_loss=True),
    "decoupled-rejection": dict(
        use_decoupled_loss=True, rejection_sampling=RejectionSamplingConfig(upper=1.3)
    ),
    "gspo": dict(importance_sampling_level="sequence"),
    "seq-mean-token-mean": dict(loss_agg_mode="seq-mean-token-mean"),
    "dr-grpo": dict(loss_agg_mode="seq-mean-token-sum-norm"),
    "no-m2po": dict(m2_threshold=None),
}


def _loss_and_grad(fn, current: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(logp, *args)``'s loss and its gradient with respect to ``logp = current``."""
    lp = current.clone().requires_grad_(True)
    loss, _ = fn(lp, *args)
    loss.backward()
    assert lp.grad is not None
    return loss.detach(), lp.grad


@pytest.mark.parametrize("scope", ["microbatch", "global"])
@pytest.mark.parametrize("variant", sorted(LOSS_VARIANTS))
def test_custom_loss_equals_library_loss(variant, scope):
    ex = load_example("custom_loss")
    cfg = ActorConfig(**{"m2_threshold": 0.05, "m2_scope": scope, **LOSS_VARIANTS[variant]})
    library = PPOActor(cfg, engine=None, group_size=4, max_new_tokens=12)
    actor = ex["CustomLossActor"](cfg, None, 4, 12)  # the subclass plugged into training
    custom = functools.partial(ex["m2po_loss_fn"], config=cfg, max_new_tokens=12)
    for seed in range(3):
        mb = ex["random_micro_batch"](seed)
        if scope == "global" and cfg.m2_threshold is not None:
            # what PPOActor.ppo_update hands over: the mask computed over the whole minibatch
            mb["m2po_mask"], _ = global_m2po_mask(
                mb["logprobs"], mb["prox_logp"], mb["loss_mask"], cfg.m2_threshold
            )
        gen = torch.Generator().manual_seed(100 + seed)
        current = mb["prox_logp"] + 0.2 * torch.randn(mb["prox_logp"].shape, generator=gen)
        entropy = torch.rand(current.shape, generator=gen)
        lib_loss, lib_grad = _loss_and_grad(library._loss_fn, current, entropy, mb, 0)
        own_loss, own_grad = _loss_and_grad(custom, current, entropy, mb)
        sub_loss, sub_grad = _loss_and_grad(actor._loss_fn, current, entropy, mb, 0)
        assert torch.equal(lib_loss, own_loss), (variant, seed)
        assert torch.equal(lib_grad, own_grad), (variant, seed)
        assert torch.equal(sub_loss, lib_loss) and torch.equal(sub_grad, lib_grad)


def test_custom_loss_extra_term_is_the_documented_penalty():
    ex = load_example("custom_loss")
    cfg = ActorConfig(m2_threshold=0.05, m2_scope="microbatch")
    mb = ex["random_micro_batch"](7)
    current = mb["prox_logp"] + 0.1
    entropy = torch.zeros_like(current)
    base, _ = ex["m2po_loss_fn"](current, entropy, mb, config=cfg, max_new_tokens=12)
    coef = 0.3
    loss, stats = ex["m2po_loss_fn"](
        current, entropy, mb, config=cfg, max_new_tokens=12, behave_k2_coef=coef
    )
    mask = mb["loss_mask"]
    keep = mask & _apply_m2po_masking(mb["logprobs"], mb["prox_logp"], mask, 0.05)
    penalty = (0.5 * (current - mb["logprobs"]).pow(2))[keep].sum() / mask.sum()
    assert float(stats["custom/behave_k2"]) == pytest.approx(float(penalty), rel=1e-6)
    assert float(loss) == pytest.approx(float(base) + coef * float(penalty), rel=1e-6)


def test_custom_loss_example_checks_and_trains(tmp_path, capsys):
    ex = load_example("custom_loss")
    result = ex["main"](["--tiny", "--output-dir", str(tmp_path / "run")])
    out = capsys.readouterr().out
    for name, check in result["checks"].items():
        assert check["library_loss"] == check["custom_loss"], name
        assert check["max_abs_grad_diff"] == 0.0, name
    records = [r for r in result["metrics"] if "actor/loss" in r]
    assert [r["step"] for r in records] == [1, 2]
    assert all("custom/behave_k2" in r and math.isfinite(r["custom/behave_k2"]) for r in records)
    # staleness 1: at step 2 the batch came from the previous policy, so the term is non-zero
    assert records[1]["custom/behave_k2"] > 0
    assert "training with CustomLossActor" in out
