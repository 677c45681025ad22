"""Train/rollout engines on the tiny built-in model: log-prob agreement, micro-batching."""

from __future__ import annotations

import pytest
import torch

from areal_m2po.api.cli_args import ActorConfig, GenerationConfig, MicroBatchSpec
from areal_m2po.utils.data import completion_start, split_microbatches


@pytest.fixture(scope="module")
def tiny():
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.engine.train_engine import HFTrainEngine
    from areal_m2po.rollout.engines.hf_generator import HFGenerator

    acc = Accelerator(cpu=True)
    engine = HFTrainEngine(ActorConfig(path="builtin:tiny"), acc, total_steps=10)
    tok = AutoTokenizer.from_pretrained(resolve_model_path("builtin:tiny"))
    rollout = HFGenerator(engine.unwrapped, tok, acc.device)
    return engine, rollout, tok


def _prompts(tok, questions):
    out = []
    for q in questions:
        text = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        out.append(tok(text)["input_ids"])
    return out


QUESTIONS = ["What is 12 + 34?", "Hi", "What is 99 + 10? Reply with only the number."]


def test_behaviour_logprobs_match_train_forward(tiny):
    engine, rollout, tok = tiny
    g = GenerationConfig(n_samples=3, max_new_tokens=10, temperature=0.7)
    batch = rollout.generate(_prompts(tok, QUESTIONS), g, seed=3)
    assert batch["input_ids"].shape[0] == 9
    logp, _ = engine.forward_tokens(batch, temperature=0.7)
    mask = batch["loss_mask"]
    assert mask.any()
    diff = (logp - batch["behave_logp"])[mask].abs().max()
    assert float(diff) < 1e-4
    # nothing outside the completions
    assert (logp[~mask] == 0).all()
    assert (batch["versions"][mask] == rollout.version).all()
    assert (batch["versions"][~mask] == -1).all()


def test_rollout_layout_and_groups(tiny):
    _, rollout, tok = tiny
    g = GenerationConfig(n_samples=2, max_new_tokens=6)
    prompts = _prompts(tok, QUESTIONS[:2])
    batch = rollout.generate(prompts, g, seed=0)
    p = completion_start(batch)
    assert p == max(len(x) for x in prompts)
    # rows 0,1 are samples of prompt 0, rows 2,3 of prompt 1 (left-padded)
    for row, prompt in zip(range(4), [prompts[0]] * 2 + [prompts[1]] * 2):
        real = batch["input_ids"][row, :p][batch["attention_mask"][row, :p]].tolist()
        assert real == prompt
    # generated tokens end at EOS (inclusive) or at max_new_tokens
    lens = batch["loss_mask"].sum(-1)
    assert ((lens == 6) | ~batch["no_eos"]).all()


def test_greedy_is_deterministic(tiny):
    _, rollout, tok = tiny
    g = GenerationConfig(n_samples=1, max_new_tokens=8)
    a = rollout.generate(_prompts(tok, QUESTIONS), g, greedy=True)
    b = rollout.generate(_prompts(tok, QUESTIONS), g, greedy=True, seed=123)
    assert torch.equal(a["input_ids"], b["input_ids"])


def test_sampling_seed_reproducible(tiny):
    _, rollout, tok = tiny
    g = GenerationConfig(n_samples=2, max_new_tokens=8)
    a = rollout.generate(_prompts(tok, QUESTIONS), g, seed=5)
    b = rollout.generate(_prompts(tok, QUESTIONS), g, seed=5)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["behave_logp"], b["behave_logp"])


def test_microbatch_split_does_not_change_the_gradient(tiny):
    """One SGD step (lr 1, no clipping) moves the weights by exactly minus the gradient of the
    whole-batch loss, whatever the micro-batch split."""
    import copy

    from accelerate import Accelerator

    from areal_m2po.api.cli_args import OptimizerConfig
    from areal_m2po.engine.train_engine import HFTrainEngine

    _, rollout, tok = tiny
    g = GenerationConfig(n_samples=2, max_new_tokens=8)
    batch = rollout.generate(_prompts(tok, QUESTIONS), g, seed=11)
    batch["row"] = torch.arange(batch["input_ids"].shape[0])
    adv = torch.linspace(-1, 1, batch["input_ids"].shape[0])[:, None] * batch["loss_mask"]

    def loss_fn(logp, ent, mb):
        m = mb["loss_mask"].float()
        return -(logp * adv[mb["row"]] * m).sum() / m.sum(), {}

    def weight_fn(mb):
        return float(mb["loss_mask"].sum())

    sgd = OptimizerConfig(type="sgd", lr=1.0, beta1=0.0, gradient_clipping=0.0)
    deltas = {}
    for n_mbs in (1, 4):
        cfg = ActorConfig(
            path="builtin:tiny",
            optimizer=sgd,
            mb_spec=MicroBatchSpec(n_mbs=n_mbs, max_tokens_per_mb=None),
        )
        engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=1)
        before = copy.deepcopy(engine.unwrapped.state_dict())
        stats, _ = engine.train_batch(batch, loss_fn, weight_fn)
        assert stats["n_micro_batches"] == n_mbs
        after = engine.unwrapped.state_dict()
        deltas[n_mbs] = {k: after[k] - before[k] for k in before}
    # the reference: autograd on the full batch in one piece
    ref_engine = HFTrainEngine(ActorConfig(path="builtin:tiny"), Accelerator(cpu=True), 1)
    from areal_m2po.engine.forward import forward_logprobs

    logp, _ = forward_logprobs(ref_engine.model, batch, 1.0, False)
    m = batch["loss_mask"].float()
    loss = -(logp * adv * m).sum() / m.sum()
    loss.backward()
    grads = {n: p.grad for n, p in ref_engine.unwrapped.named_parameters()}
    moved = 0
    for name, grad in grads.items():
        for n_mbs in (1, 4):
            torch.testing.assert_close(deltas[n_mbs][name], -grad, rtol=1e-4, atol=1e-6)
        moved += int(grad.abs().sum() > 0)
    assert moved > 0


def test_split_microbatches_token_budget():
    lengths = [10, 3, 7, 7, 2, 9]
    attn = torch.zeros(6, 10, dtype=torch.bool)
    for i, n in enumerate(lengths):
        attn[i, :n] = True
    batch = {"input_ids": torch.zeros(6, 10, dtype=torch.long), "attention_mask": attn}
    groups = split_microbatches(batch, n_mbs=1, max_tokens_per_mb=20)
    assert sorted(int(i) for g in groups for i in g) == list(range(6))
    for grp in groups:
        longest = max(lengths[int(i)] for i in grp)
        assert longest * len(grp) <= 20 or len(grp) == 1
    assert len(split_microbatches(batch, n_mbs=4)) == 4
    assert len(split_microbatches(batch, n_mbs=10)) == 6


def test_split_microbatches_keeps_row_groups_together():
    """group_size=2: rows 2i and 2i + 1 always share a micro-batch, under a token budget (a
    group counts at its longest row) and when split to reach n_mbs; group_size=1 is the
    row-wise split."""
    lengths = [10, 3, 2, 7, 9, 2, 4, 4]
    attn = torch.zeros(8, 10, dtype=torch.bool)
    for i, n in enumerate(lengths):
        attn[i, :n] = True
    batch = {"input_ids": torch.zeros(8, 10, dtype=torch.long), "attention_mask": attn}
    for kwargs in ({"max_tokens_per_mb": 20}, {"n_mbs": 3}, {"n_mbs": 9}, {"n_mbs": 1}):
        groups = split_microbatches(batch, group_size=2, **kwargs)
        rows = [[int(i) for i in g] for g in groups]
        assert sorted(r for g in rows for r in g) == list(range(8)), kwargs
        for g in rows:
            assert g == sorted(g) and all(
                g[k] % 2 == 0 and g[k + 1] == g[k] + 1 for k in range(0, len(g), 2)
            )
    budget = split_microbatches(batch, max_tokens_per_mb=20, group_size=2)
    # pair lengths 10, 7, 9, 4: each pair alone or [7, 4] within 2 x 2 x 7 = 28 > 20 -> alone
    assert [g.tolist() for g in budget] == [[0, 1], [4, 5], [2, 3], [6, 7]]
    assert len(split_microbatches(batch, n_mbs=9, group_size=2)) == 4
    assert [g.tolist() for g in split_microbatches(batch, max_tokens_per_mb=20)] == [
        g.tolist() for g in split_microbatches(batch, max_tokens_per_mb=20, group_size=1)
    ]
    with pytest.raises(ValueError, match="8 rows do not split into groups of group_size=3"):
        split_microbatches(batch, group_size=3)
