"""FSDP2 (``backend: fsdp2``): launch checks, a sharded training run, resume after SIGKILL.

The one-update equality of FSDP2 on 2 processes with 1 process is in ``tests/multiproc/test_multiproc.py``
(``test_one_update_equal_with_one_and_two_processes``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from procs import (
    REPO,
    SUPPORT,
    TIMEOUT_S,
    check_exit,
    launch_command,
    popen,
    read_metrics,
    subprocess_env,
    train_command,
)

from areal_m2po.api.cli_args import ConfigError, PPOConfig
from areal_m2po.api.config_loader import load_config, save_config
from areal_m2po.trainer.preflight import check_launch


def _cfg(*overrides: str) -> PPOConfig:
    return load_config(["--config", str(REPO / "configs" / "tiny.yaml"), *overrides])


# ------------------------------------------------------------------------------ launch checks


@pytest.mark.parametrize(
    ("overrides", "launch", "key", "words"),
    [
        (("actor.backend=fsdp2",), ("NO", 1, False, "no"), "actor.backend", "--multi_gpu"),
        (("actor.backend=fsdp2",), ("MULTI_CPU", 1, False, "no"), "actor.backend", "has 1"),
        (
            ("actor.backend=fsdp2", "actor.fsdp.offload_params=true"),
            ("MULTI_CPU", 2, False, "no"),
            "actor.fsdp.offload_params",
            "needs GPUs",
        ),
        (("actor.backend=fsdp2",), ("MULTI_GPU", 2, True, "bf16"), "actor.backend", "param_dtype"),
        ((), ("DEEPSPEED", 8, True, "no"), "actor.backend", "actor.backend=fsdp2"),
        ((), ("FSDP", 8, True, "no"), "actor.backend", "--use_fsdp` needs backend=fsdp2"),
        (
            ("actor.backend=fsdp2", "critic.enabled=true", "actor.adv_norm.mean_level=batch"),
            ("FSDP", 8, True, "no"),
            "critic.backend",
            "critic.backend=fsdp2",
        ),
        (
            ("critic.enabled=true", "critic.backend=fsdp2", "actor.adv_norm.mean_level=batch"),
            ("NO", 1, False, "no"),
            "critic.backend",
            "fsdp2 shards over processes",
        ),
    ],
)
def test_bad_launch_names_the_key(overrides, launch, key, words):
    with pytest.raises(ConfigError) as info:
        check_launch(_cfg(*overrides), *launch)
    assert info.value.key == key
    assert words in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "launch"),
    [
        ((), ("NO", 1, False, "no")),
        ((), ("MULTI_CPU", 2, False, "no")),
        (("actor.backend=fsdp2",), ("MULTI_CPU", 2, False, "no")),
        (("actor.backend=fsdp2", "actor.fsdp.offload_params=true"), ("MULTI_GPU", 8, True, "no")),
        (("actor.backend=fsdp2", "actor.fsdp.param_dtype=bfloat16"), ("FSDP", 8, True, "no")),
    ],
)
def test_good_launch_passes(overrides, launch):
    check_launch(_cfg(*overrides), *launch)


def test_fsdp_keys_need_the_fsdp2_backend():
    with pytest.raises(ConfigError, match=r"^actor\.fsdp\.reshard_after_forward: only applies"):
        _cfg("actor.fsdp.reshard_after_forward=false")
    assert _cfg("actor.backend=fsdp2", "actor.fsdp.reshard_after_forward=false").actor.fsdp


def test_single_process_fsdp2_is_one_line_before_any_model_loads(tmp_path):
    # passes the start-up path check, but loading it would fail: it must not be reached
    (tmp_path / "empty_model").mkdir()
    (tmp_path / "empty_model" / "config.json").write_text('{"model_type": "no-such-model"}')
    proc = subprocess.run(
        [sys.executable, *train_command(tmp_path / "run", 1)]
        + ["actor.backend=fsdp2", f"actor.path={tmp_path / 'empty_model'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=subprocess_env(),
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith("error: actor.backend: fsdp2 shards"), lines
    assert "no-such-model" not in proc.stderr  # refused before any model was loaded


# ----------------------------------------------------------------------- 2-process FSDP2 runs


@pytest.mark.multiproc
def test_sharded_run_keeps_rollout_equal_to_the_gathered_policy(tmp_path):
    """Actor, reference and critic sharded over 2 processes: after every sync the rollout
    weights equal the gathered policy, behaviour log-probs of the next batch equal a forward
    of the sharded policy (1e-4), tokens carry the new version; the HF save loads back."""
    out = tmp_path / "out.pt"
    worker = str(SUPPORT / "fsdp_worker.py")
    check_exit([popen([*launch_command(2), worker, str(out), str(tmp_path / "run")], tmp_path)])
    records = torch.load(out, weights_only=False)
    assert len(records) == 2
    for r in records:
        assert r["sharded"] == [1.0]
        assert len(r["weights"]) == 2 and max(r["weights"]) == 0.0
        assert max(r["behave_logp_gap"]) < 1e-4
        assert r["versions"] == [1.0, 1.0]
        assert r["moved"][0] > 1e-5  # the policy did change: the syncs carried something
    assert records[0]["hf"] == [0.0]


@pytest.mark.multiproc
@pytest.mark.slow
def test_sharded_sigkill_and_rerun_continues_bitwise(tmp_path):
    """2 processes, fsdp2: 3 steps straight == 2 steps, SIGKILL (both ranks, right after the
    step-2 checkpoint), rerun; the checkpoint holds shards (no full gather); a 1-process resume
    is refused in one line."""
    extra = ("actor.backend=fsdp2",)
    straight = tmp_path / "straight"
    killed = tmp_path / "killed"
    cfg = load_config(train_command(killed, 3, *extra)[2:])
    save_config(cfg, str(tmp_path / "killed.yaml"))
    worker = str(SUPPORT / "recover_worker.py")
    procs = [
        popen([*launch_command(2), *train_command(straight, 3, *extra)], tmp_path),
        popen([*launch_command(2), worker, str(tmp_path / "killed.yaml"), "2"], tmp_path),
    ]
    check_exit(procs[:1])
    out, _ = procs[1].communicate(timeout=TIMEOUT_S)
    assert procs[1].returncode != 0 and "SIGKILL" in out, out[-3000:]
    ckpt = killed / "recover" / "step_2"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["shards"] == ["actor_shards"] and meta["world_size"] == 2
    assert "model" not in torch.load(ckpt / "actor.pt", weights_only=True)
    assert sorted(p.name for p in (ckpt / "actor_shards").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert not (killed / "recover" / "step_3").exists()
    # the same command again, 2 processes: continues from step 2
    check_exit([popen([*launch_command(2), *train_command(killed, 3, *extra)], tmp_path)])
    a, b = read_metrics(straight), read_metrics(killed)
    assert [r["step"] for r in b] == [1, 2, 3]

    def untimed(r: dict) -> dict:
        return {k: v for k, v in r.items() if not k.startswith("timing/")}

    assert [untimed(r) for r in a] == [untimed(r) for r in b]
    # another world size: one line, naming the checkpoint and what to do
    proc = subprocess.run(
        [sys.executable, *train_command(straight, 4)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=subprocess_env(),
    )
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "written by 2 processes but this run has 1" in lines[0], lines
