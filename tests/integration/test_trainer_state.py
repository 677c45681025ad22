"""The trainer owns its state (``RLTrainer.state_dict``/``load_state_dict``, the actor's and the
rollout engine's parts); ``utils/recover.py`` writes, lists, prunes and checks checkpoint
directories of plain dicts and tensors."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch

from areal_m2po.utils import recover

pytestmark = pytest.mark.usefixtures("restore_threads")


# ------------------------------------------------------------------ directory I/O, plain dicts
def _write(root: str, step: int, keep_last: int = 5, remove: tuple[str, ...] = ()) -> str:
    tmp = recover.new_checkpoint_dir(root, step)
    files = {"a.pt": {"x": torch.arange(3)}, "b.pt": [step]}
    meta = {"world_size": 1, "config": {"seed": 1, "actor.path": "m"}}
    return recover.write_checkpoint(tmp, step, files, meta, keep_last, remove)


def test_write_list_prune_and_remove(tmp_path):
    root = str(tmp_path / "recover")
    paths = [_write(root, s, keep_last=2) for s in (1, 2, 3)]
    assert paths[-1] == os.path.join(root, "step_3")
    assert [s for s, _ in recover.list_checkpoints(root)] == [2, 3]
    meta = json.loads(Path(paths[-1], "meta.json").read_text())
    assert meta["format"] == recover.FORMAT_VERSION == 2
    assert meta["step"] == 3 and meta["files"] == ["a.pt", "b.pt"]
    # directories listed in ``remove`` go once the new checkpoint is complete
    _write(root, 4, keep_last=5, remove=(paths[1],))
    assert [s for s, _ in recover.list_checkpoints(root)] == [3, 4]
    # no temporary directory is left behind
    assert sorted(os.listdir(root)) == ["step_3", "step_4"]


def test_read_meta_checks_format_world_and_config(tmp_path):
    root = str(tmp_path / "recover")
    path = _write(root, 1)
    meta_file = os.path.join(path, "meta.json")
    assert recover.read_meta(path, 1, {"seed": 1, "other.key": 9})["step"] == 1
    with pytest.raises(recover.RecoverError, match="2 processes|but this run has 2"):
        recover.read_meta(path, 2, {})
    with pytest.raises(recover.RecoverError) as info:
        recover.read_meta(path, 1, {"seed": 2, "actor.path": "m"})
    assert meta_file in str(info.value) and "seed=1 (now 2)" in str(info.value)
    assert "actor.path" not in str(info.value)
    # a checkpoint of the previous format: one line naming the file and what to do
    meta = json.loads(Path(meta_file).read_text())
    Path(meta_file).write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(recover.RecoverError) as info:
        recover.read_meta(path, 1, {})
    msg = str(info.value)
    assert "\n" not in msg and meta_file in msg and "format 1" in msg
    assert "reads format 2" in msg and "overwrite_output_dir=true" in msg


def test_load_files_names_the_culprit_file(tmp_path):
    path = _write(str(tmp_path / "recover"), 1)
    got = []
    recover.load_files(path, [("b.pt", got.append), ("a.pt", got.append)])
    assert got[0] == [1] and torch.equal(got[1]["x"], torch.arange(3))

    def refuse(state):
        raise KeyError("model")

    with pytest.raises(recover.RecoverError) as info:
        recover.load_files(path, [("a.pt", refuse)])
    assert os.path.join(path, "a.pt") in str(info.value) and "does not match" in str(info.value)
    with pytest.raises(recover.RecoverError, match="missing"):
        recover.load_files(path, [("c.pt", got.append)])
    Path(path, "b.pt").write_bytes(b"\x00" * 8)
    with pytest.raises(recover.RecoverError) as info:
        recover.load_files(path, [("b.pt", got.append)])
    assert os.path.join(path, "b.pt") in str(info.value) and "corrupt" in str(info.value)


def test_checkpoint_to_resume_follows_the_mode(tmp_path):
    root = str(tmp_path / "recover")
    assert recover.checkpoint_to_resume(root, "auto") is None
    assert recover.checkpoint_to_resume(root, "disabled") is None
    with pytest.raises(recover.RecoverError, match="recover.mode=resume"):
        recover.checkpoint_to_resume(root, "resume")
    _write(root, 1)
    path = _write(root, 2)
    assert recover.checkpoint_to_resume(root, "auto") == path
    assert recover.checkpoint_to_resume(root, "resume") == path
    assert recover.checkpoint_to_resume(root, "disabled") is None


# ------------------------------------------------------------------------- the trainer's state
def test_trainer_state_dict_roundtrip(tmp_path):
    """A fresh trainer that loads a trained one's ``state_dict`` holds the same step, rollout
    count, loader position, actor state (the M2PO streak and warning flag), weights, optimizer,
    rollout version and queue, and restores the RNG states."""
    from tiny_runs import make_cfg

    from areal_m2po.api.cli_args import RecoverConfig
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = make_cfg(tmp_path, "a", steps=1, staleness=1, recover=RecoverConfig(mode="disabled"))
    a = RLTrainer(cfg)
    try:
        a.train()
        a.actor.load_state_dict({"high_mask_streak": 2, "warned_no_m2po": True})
        state = a.state_dict()
    finally:
        a.close()
    assert set(state) == {"trainer", "actor", "rollout", "rank"}
    assert state["trainer"]["actor"] == {"high_mask_streak": 2, "warned_no_m2po": True}
    assert state["trainer"]["step"] == 1 and state["trainer"]["n_rollouts"] == 2
    # the behaviour policy was synced after the step: its weights are the policy's, not saved
    assert state["rollout"] == {"version": 1, "weights": None}
    rng_after_save = torch.rand(4)

    b = RLTrainer(make_cfg(tmp_path, "b", steps=2, recover=RecoverConfig(mode="disabled")))
    try:
        assert b.step == 0 and b.actor.state_dict()["high_mask_streak"] == 0
        b.load_state_dict(state)
        assert torch.equal(torch.rand(4), rng_after_save)  # RNG restored last
        assert (b.step, b.n_rollouts) == (1, 2)
        assert b.actor.state_dict() == {"high_mask_streak": 2, "warned_no_m2po": True}
        assert b.loader.state_dict() == state["trainer"]["loader"]
        assert b.actor_engine.version == a.actor_engine.version == 1
        assert b.rollout.engine.get_version() == 1
        for (k, va), (_, vb) in zip(a.actor_engine.full_tensors(), b.actor_engine.full_tensors()):
            assert torch.equal(va, vb), k
        for k, v in b.rollout.engine.generator.model.state_dict().items():
            assert torch.equal(v, a.rollout.engine.generator.model.state_dict()[k]), k
        ((batch, info),) = b.queue
        ((batch_a, info_a),) = state["rank"]["queue"]
        assert info == info_a and all(torch.equal(batch[k], batch_a[k]) for k in batch_a)
        opt_a, opt_b = a.actor_engine.optimizer.state_dict(), b.actor_engine.optimizer.state_dict()
        assert opt_a["state"].keys() == opt_b["state"].keys()
        for i in opt_a["state"]:
            assert all(
                torch.equal(opt_a["state"][i][k], opt_b["state"][i][k]) for k in ("exp_avg",)
            )
    finally:
        b.close()


def test_rollout_state_saves_weights_only_when_they_differ(tmp_path):
    """``HFGenerator.state_dict`` leaves the weights out when they equal the policy's at the
    same version, and keeps them otherwise (e.g. behind by one version)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.rollout.engines.hf_generator import HFGenerator

    path = resolve_model_path("builtin:tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    engine = HFGenerator(model, tok, torch.device("cpu"))
    policy = dict(model.state_dict())
    assert engine.state_dict(iter(policy.items()), 0)["weights"] is None
    assert engine.state_dict(iter(policy.items()), 1)["weights"] is not None  # another version
    norm = next(k for k in policy if "norm" in k)  # not tied to another tensor
    changed = {k: v + 1 if k == norm else v for k, v in policy.items()}
    # (tensors share memory with the engine's, as torch's state_dict does: copy to keep them)
    state = copy.deepcopy(engine.state_dict(iter(changed.items()), 0))
    assert state["version"] == 0 and state["weights"].keys() == policy.keys()
    # loading: the saved weights, or the policy's when none were saved
    engine.load_state_dict({"version": 3, "weights": None}, lambda: changed)
    assert engine.version == 3
    assert all(torch.equal(v, changed[k]) for k, v in engine.model.state_dict().items())
    engine.load_state_dict(state, lambda: changed)
    assert all(torch.equal(v, policy[k]) for k, v in engine.model.state_dict().items())
