"""Several processes on this CPU through ``accelerate launch --multi_gpu`` (gloo).

* One PPO update of the tiny model on the same fixed global batch gives the same loss, grad
  norm, global M2PO mask and updated weights with 1 and with 2 processes; with 2 processes, a
  rank without any loss-mask token still takes the step with the other (no hang), and a step
  with no such token on any rank is an empty step on both.
* A 2-process training run writes one metrics.jsonl (rank 0 only) without duplicate steps and
  recover checkpoints holding both ranks' state; (slow) rerunning it continues bitwise.
"""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from procs import SUPPORT, TIMEOUT_S, check_exit, launch_command, popen, read_metrics, train_command

pytestmark = pytest.mark.multiproc


def _assert_same_update(a: dict, b: dict) -> None:
    """1-process result ``a`` and 2-process result ``b`` of the same update agree."""
    assert (a["world"], b["world"]) == (1, 2)
    sa, sb = a["stats"], b["stats"]
    assert sa.keys() == sb.keys()
    assert sa["actor/skipped_steps"] == sb["actor/skipped_steps"] == 0
    assert math.isclose(sa["actor/loss"], sb["actor/loss"], rel_tol=1e-4, abs_tol=1e-6)
    assert math.isclose(sa["actor/grad_norm"], sb["actor/grad_norm"], rel_tol=1e-5)
    for key in ("actor/entropy", "actor/behave_kl", "actor/clip_fraction"):
        assert math.isclose(sa[key], sb[key], rel_tol=1e-5, abs_tol=1e-7), key
    # the global M2PO mask: same statistics, same tokens masked, and it masked something
    for key in ("m2po/n_valid", "m2po/n_masked", "m2po/m2_before", "m2po/m2_after"):
        assert sa[key] == pytest.approx(sb[key], rel=1e-9), key
    assert 0 < sa["m2po/n_masked"] < sa["m2po/n_valid"]
    mask_one = a["masks"][0][0]
    mask_two = torch.cat([rank_masks[0] for rank_masks in b["masks"]])
    assert mask_one.shape == mask_two.shape and torch.equal(mask_one, mask_two)
    # the two ranks held different numbers of valid tokens (the denominator must be global)
    assert b["n_valid_local"] * 2 != sa["m2po/n_valid"]
    assert a["state"].keys() == b["state"].keys()
    for name, w in a["state"].items():
        torch.testing.assert_close(b["state"][name], w, rtol=1e-5, atol=1e-6, msg=name)
    # ranks holding different numbers of groups took the same optimizer steps (no hang)
    assert b["uneven_stats"]["actor/skipped_steps"] == 0
    assert math.isfinite(b["uneven_stats"]["actor/grad_norm"])
    moved = max(float((w - a["initial"][name]).abs().max()) for name, w in a["state"].items())
    assert moved > 1e-4  # the update changed the weights
    # rank 1 without a loss-mask token: the step is taken (no hang), then no rank has one: the
    # step is empty on every rank; the ranks' weights stay equal throughout
    one, none = b["one_empty_stats"], b["all_empty_stats"]
    assert one["actor/empty_steps"] == 0 and one["actor/skipped_steps"] == 0
    assert one["actor/grad_norm"] > 0
    assert none["actor/empty_steps"] == 1 and none["actor/skipped_steps"] == 0
    assert none["actor/grad_norm"] == 0
    (one_0, none_0), (one_1, none_1) = b["empty_checksums"]
    assert one_0 == one_1 and none_0 == none_1
    assert none_0 == one_0  # the empty step left the weights unchanged


def test_one_update_equal_with_one_and_two_processes(tmp_path):
    """One process, two with DDP and two with FSDP2 (actor.backend=fsdp2) give one update."""
    worker = str(SUPPORT / "multiproc_worker.py")
    one, ddp, fsdp2 = tmp_path / "one.pt", tmp_path / "ddp.pt", tmp_path / "fsdp2.pt"
    check_exit(
        [
            popen([sys.executable, worker, str(one)], tmp_path),
            popen([*launch_command(2), worker, str(ddp)], tmp_path),
            popen([*launch_command(2), worker, str(fsdp2), "fsdp2"], tmp_path),
        ]
    )
    a, d, f = (torch.load(p, weights_only=False) for p in (one, ddp, fsdp2))
    _assert_same_update(a, d)
    _assert_same_update(a, f)
    # uneven groups, and uneven micro-batch counts (rank 1: one micro-batch, rank 0: two; the
    # sharded rank 1 runs an idle forward/backward): FSDP2 takes DDP's step
    for key in ("uneven_stats", "uneven_mb_stats"):
        for stat in ("actor/loss", "actor/grad_norm"):
            assert math.isclose(d[key][stat], f[key][stat], rel_tol=1e-5, abs_tol=1e-7), stat
    for name, w in d["state_after_uneven"].items():
        torch.testing.assert_close(f["state_after_uneven"][name], w, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fsdp2_accumulating_unsharded_grads_gives_the_same_update(tmp_path):
    """actor.fsdp.accumulate_unsharded_grads: one reduce-scatter after the last micro-batch."""
    worker = str(SUPPORT / "multiproc_worker.py")
    one, acc = tmp_path / "one.pt", tmp_path / "acc.pt"
    check_exit(
        [
            popen([sys.executable, worker, str(one)], tmp_path),
            popen([*launch_command(2), worker, str(acc), "fsdp2+accumulate"], tmp_path),
        ]
    )
    _assert_same_update(*(torch.load(p, weights_only=False) for p in (one, acc)))


def test_two_process_training_run(tmp_path):
    out = tmp_path / "run"
    # dynamic filtering can leave the ranks different numbers of groups; with 2 minibatches
    # they must still take the same optimizer steps
    extra = ("rollout.dynamic_filtering=true", "actor.ppo_n_minibatches=2")
    check_exit([popen([*launch_command(2), *train_command(out, 2, *extra)], tmp_path)])
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1, 2]  # rank 0 alone writes: no duplicates
    for r in records:
        assert math.isfinite(r["actor/loss"]) and math.isfinite(r["actor/grad_norm"])
        assert r["reward/n_errors"] == 0
        assert r["m2po/n_valid"] > 0
        assert 0 <= r["rollout/filtered_group_fraction"] <= 1
    ranks = torch.load(out / "recover" / "step_2" / "ranks.pt", weights_only=True)
    assert [r["rank"] for r in ranks] == [0, 1]
    meta = json.loads((out / "recover" / "step_2" / "meta.json").read_text())
    assert meta["world_size"] == 2
    # each rank queued its own half of the prompts (staleness 1): 2 prompts x 4 samples
    for r in ranks:
        ((batch, _info),) = r["queue"]
        assert batch["input_ids"].shape[0] == 8
    assert not torch.equal(
        ranks[0]["queue"][0][0]["input_ids"], ranks[1]["queue"][0][0]["input_ids"]
    )


@pytest.mark.slow
def test_two_process_resume_is_bitwise(tmp_path):
    """2 processes: 3 steps straight == 2 steps, then the same command for 3 steps."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    check_exit(
        [
            popen([*launch_command(2), *train_command(straight, 3)], tmp_path),
            popen([*launch_command(2), *train_command(resumed, 2)], tmp_path),
        ]
    )
    proc = popen([*launch_command(2), *train_command(resumed, 3)], tmp_path)
    out, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, out[-4000:]
    assert "resumed from recover checkpoint" in out
    a, b = read_metrics(straight), read_metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3]

    def untimed(r: dict) -> dict:
        return {k: v for k, v in r.items() if not k.startswith("timing/")}

    assert [untimed(r) for r in a] == [untimed(r) for r in b]
