"""Sync HF rollout without a copy of the policy: the generator samples from the trainer's own
module (``HFGenerator(share=True)``, ``RLTrainer.share_rollout_policy``).

The reference is the copying generator: the same seed gives the very same tokens, behaviour
log-probs and versions, and a training run gives the very same metrics (every value but
timings), bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from tiny_runs import read_metrics, tiny_config

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.rollout.engines.hf_generator import HFGenerator


@pytest.fixture(scope="module")
def tiny() -> tuple[torch.nn.Module, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path

    path = resolve_model_path("builtin:tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tok


def _prompts(tok) -> list[list[int]]:
    return [tok(q)["input_ids"] for q in ("What is 12 + 34?", "Hi there", "1 2 3")]


@pytest.mark.parametrize("greedy", [False, True])
def test_shared_generator_samples_what_a_copy_samples(tiny, greedy):
    model, tok = tiny
    model.train()  # the trainer's module between updates
    gcfg = GenerationConfig(n_samples=3, max_new_tokens=10, temperature=0.8)
    copy_gen = HFGenerator(model, tok, torch.device("cpu"))
    shared = HFGenerator(model, tok, torch.device("cpu"), share=True)
    a = copy_gen.generate(_prompts(tok), gcfg, greedy=greedy, seed=7)
    b = shared.generate(_prompts(tok), gcfg, greedy=greedy, seed=7)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert model.training, "generation left the trainer's module in eval mode"
    assert shared.model is model
    assert all(p.requires_grad for p in model.parameters())


def test_shared_generator_holds_no_weights_of_its_own(tiny):
    model, tok = tiny
    shared = HFGenerator(model, tok, torch.device("cpu"), share=True)
    shared.update_weights(iter(()), 5)  # nothing to copy: the weights are the policy's
    assert shared.version == 5
    state = shared.state_dict(iter(()), 4)
    assert state == {"version": 5, "weights": None}
    shared.load_state_dict({"version": 2, "weights": None}, policy=lambda: iter(()))
    assert shared.version == 2
    same = {k: v.clone() for k, v in model.state_dict().items()}
    shared.load_state_dict({"version": 3, "weights": same}, policy=lambda: iter(()))
    assert shared.version == 3
    other = {k: v + 1 if v.is_floating_point() else v for k, v in same.items()}
    with pytest.raises(ValueError, match="rollout weights differ from the policy's"):
        shared.load_state_dict({"version": 4, "weights": other}, policy=lambda: iter(()))


def _run(cfg, share: bool):
    from areal_m2po.trainer.rl_trainer import RLTrainer

    class Trainer(RLTrainer):
        share_rollout_policy = share

    trainer = Trainer(cfg)
    try:
        generator = trainer.rollout.engine.generator
        assert (generator.model is trainer.actor_engine.unwrapped) == share
        trainer.train()
    finally:
        trainer.close()
    return read_metrics(cfg.output_dir)


def _untimed(records):
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in records]


@pytest.mark.parametrize("staleness", [0, 1])
def test_training_without_the_copy_is_bit_identical(tmp_path, staleness):
    """Every metric of a sync run (rewards, M2PO stats, losses, grad norms, evaluations) is
    the same float with and without the copy."""
    runs = []
    for share in (False, True):
        cfg = tiny_config(tmp_path / str(share), steps=3, staleness=staleness)
        cfg.saver.freq_steps = None
        cfg.saver.save_at_end = False
        runs.append(_untimed(_run(cfg, share)))
    assert len(runs[0]) == 4
    assert runs[0] == runs[1]


def test_a_float16_policy_rolls_out_from_a_copy_that_follows_the_updates(tmp_path):
    """float16 mixed precision trains float32 master weights under autocast, so the engine
    hands the rollout side a float16 copy, never its own module (the sync HF engine used to
    share that copy and never refresh it): the trainer syncs it through
    ``weights_for_rollout`` after every update, and it ends equal to the final masters in
    float16."""
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = tiny_config(tmp_path, steps=2, staleness=0, dtype="float16")
    cfg.saver.freq_steps = None
    cfg.saver.save_at_end = False
    cfg.evaluator.freq_steps = None
    cfg.evaluator.eval_at_end = False
    trainer = RLTrainer(cfg)
    engine = trainer.actor_engine
    handed: list[int] = []
    hand_over = engine.weights_for_rollout

    def spy():
        weights = hand_over()
        handed.append(weights.version)
        return weights

    engine.weights_for_rollout = spy
    try:
        generator = trainer.rollout.engine.generator
        assert not generator.share and generator.model is not engine.unwrapped
        start = {k: v.clone() for k, v in generator.model.state_dict().items()}
        trainer.train()
        want = engine.build_full_model().state_dict()
        got = generator.model.state_dict()
        assert got.keys() == want.keys()
        for name, value in want.items():
            assert value.dtype == torch.float16 and torch.equal(got[name], value), name
        assert any(not torch.equal(got[k], start[k]) for k in start), "the copy never moved"
    finally:
        trainer.close()
    assert handed == [0, 1, 2] and engine.version == 2  # start, then one sync per step
