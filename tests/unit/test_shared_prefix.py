"""Scoring with each distinct prompt run once (engine/shared_prefix.py) against the plain pass."""

from __future__ import annotations

import pytest
import torch

from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.forward import forward_logprobs
from areal_m2po.engine.shared_prefix import (
    forward_logprobs_shared_prefix,
    prompt_index,
    shared_prefix_verdict,
    split_prompt_groups,
)

VOCAB = 97


def _model(attn: str = "sdpa") -> torch.nn.Module:
    model = build_tiny_llama(
        VOCAB,
        0,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    return model.eval()


def _group_batch(
    group_sizes: tuple[int, ...] = (3, 1, 4),
    seed: int = 0,
    max_prompt: int = 9,
    max_new: int = 8,
    full: bool = False,
) -> dict[str, torch.Tensor]:
    """The rollout layout, rows of a group sharing their prompt: left-padded prompts of several
    lengths, completions of several lengths (all ``max_new`` with ``full``) from a common
    column, right padding."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(1, max_prompt + 1, (len(group_sizes),), generator=g).tolist()
    prompts = [torch.randint(3, VOCAB, (p,), generator=g) for p in p_lens]
    p_max = max(p_lens)
    n = sum(group_sizes)
    t = p_max + max_new
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    loss = torch.zeros(n, t, dtype=torch.bool)
    row = 0
    for prompt, size in zip(prompts, group_sizes, strict=True):
        for _ in range(size):
            c = int(torch.randint(1, max_new + 1, (1,), generator=g))
            c = max_new if row == 0 or full else c
            ids[row, p_max - len(prompt) : p_max] = prompt
            ids[row, p_max : p_max + c] = torch.randint(3, VOCAB, (c,), generator=g)
            attn[row, p_max - len(prompt) : p_max + c] = True
            loss[row, p_max : p_max + c] = True
            row += 1
    return {"input_ids": ids, "attention_mask": attn, "loss_mask": loss}


def test_prompt_index_groups_rows_by_prompt_in_order() -> None:
    batch = _group_batch((3, 1, 4))
    start, prompt_of_row = prompt_index(batch)
    assert start == int((~batch["loss_mask"].any(0)).sum())
    assert prompt_of_row.tolist() == [0, 0, 0, 1, 2, 2, 2, 2]


def test_prompt_index_ignores_padding_but_not_tokens() -> None:
    batch = _group_batch((2, 2), seed=1)
    # same tokens, one more left pad than real: still the same prompt; one token changed: not
    ids = batch["input_ids"].clone()
    start = int((~batch["loss_mask"].any(0)).sum())
    ids[1, start - 1] = (ids[1, start - 1] + 1) % VOCAB
    batch["input_ids"] = ids
    assert prompt_index(batch)[1].tolist() == [0, 1, 2, 2]


def test_prompt_index_refuses_layouts_without_a_shared_prompt() -> None:
    batch = _group_batch((2, 2))
    no_completion = {**batch, "loss_mask": torch.zeros_like(batch["loss_mask"])}
    assert prompt_index(no_completion) is None
    start = int((~batch["loss_mask"].any(0)).sum())
    holed = {k: v.clone() for k, v in batch.items()}
    holed["attention_mask"][0, start - 1] = False  # a row whose prompt does not end at P
    assert prompt_index(holed) is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("sizes", [(3, 1, 4), (8, 8), (1, 1, 1)])
def test_equals_the_plain_pass(attn: str, sizes: tuple[int, ...]) -> None:
    model = _model(attn)
    batch = _group_batch(sizes, seed=len(sizes))
    with torch.no_grad():
        plain, plain_ent = forward_logprobs(model, batch, 1.3, True)
        shared, shared_ent = forward_logprobs_shared_prefix(model, batch, 1.3, True)
    mask = batch["loss_mask"]
    assert torch.allclose(shared[mask], plain[mask], atol=1e-5, rtol=0)
    assert torch.allclose(shared_ent[mask], plain_ent[mask], atol=1e-5, rtol=0)
    prompt_cols = ~mask.any(0)  # zero outside the completion columns, as the plain pass
    assert not shared[:, prompt_cols].any() and not shared_ent[:, prompt_cols].any()


def test_gradients_equal_the_plain_pass() -> None:
    batch = _group_batch((3, 2), seed=5)
    grads = []
    for fn in (forward_logprobs, forward_logprobs_shared_prefix):
        model = _model()
        logp, _ = fn(model, batch, 1.0, False)
        (logp * batch["loss_mask"]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def test_extra_padding_columns_are_ignored() -> None:
    model = _model()
    batch = _group_batch((2, 3), seed=2)
    pad = {k: torch.nn.functional.pad(v, (2, 3)) for k, v in batch.items()}
    with torch.no_grad():
        a, _ = forward_logprobs_shared_prefix(model, batch, 1.0, False)
        b, _ = forward_logprobs_shared_prefix(model, pad, 1.0, False)
    assert torch.equal(b[:, 2:-3], a) and not b[:, :2].any() and not b[:, -3:].any()


def test_split_keeps_groups_whole_within_the_budget() -> None:
    batch = _group_batch((3, 1, 4, 2), seed=4, max_prompt=5, max_new=6)
    start, prompt_of_row = prompt_index(batch)
    width = batch["input_ids"].shape[1] - start
    budget = 2 * start + 4 * width  # two prompts and four completions
    pieces = split_prompt_groups(batch, prompt_of_row, start, budget)
    assert torch.equal(torch.cat(pieces), torch.arange(10))
    for rows in pieces:
        groups = prompt_of_row[rows].unique()
        cost = groups.numel() * start + rows.numel() * width
        assert cost <= budget or groups.numel() == 1  # a lone big group may exceed it
        for g in groups:  # a group is never split
            assert set(torch.nonzero(prompt_of_row == g).flatten().tolist()) <= set(rows.tolist())
    assert [r.numel() for r in pieces] == [4, 4, 2]
    assert len(split_prompt_groups(batch, prompt_of_row, start, None)) == 1


def test_split_cuts_a_group_larger_than_the_budget() -> None:
    """The budget bounds a training pass's activations: a group that does not fit is cut into
    pieces of as many rows as fit beside its prompt, each with its prompt again."""
    batch = _group_batch((3, 7, 2), seed=4, max_prompt=5, max_new=6)
    start, prompt_of_row = prompt_index(batch)
    width = batch["input_ids"].shape[1] - start
    pieces = split_prompt_groups(batch, prompt_of_row, start, start + 3 * width)
    assert [r.tolist() for r in pieces] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9], [10, 11]]
    for rows in pieces:
        assert prompt_of_row[rows].unique().numel() * start + rows.numel() * width <= (
            start + 3 * width
        )
    # a budget below one row beside the prompt: one row per micro-batch
    assert all(r.numel() == 1 for r in split_prompt_groups(batch, prompt_of_row, start, 1))


def test_verdict() -> None:
    model = _model()
    assert shared_prefix_verdict(model, _group_batch((3, 2)), 1.0, False) is True
    assert model.training is False
    # distinct prompts (their heads may be shared): checked on them
    assert shared_prefix_verdict(model, _group_batch((1, 1, 1)), 1.0, False) is True
    # a single row: nothing to compare, decided later
    assert shared_prefix_verdict(model, _group_batch((1,)), 1.0, False) is None


def test_verdict_refuses_a_model_whose_cache_changes_the_answer() -> None:
    model = _model()
    with torch.no_grad():  # weights large enough that the context moves the log-probs
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8)
    assert shared_prefix_verdict(model, _group_batch((3, 2)), 1.0, False) is True
    original = type(model.model.rotary_emb).forward

    def shifted(self, x, position_ids):  # noqa: ANN001, ANN202 - a deliberately broken model
        # positions seen in a call with a cache (the completion columns) are off by 64
        return original(self, x, position_ids + (64 if position_ids.min() > 0 else 0))

    model.model.rotary_emb.forward = shifted.__get__(model.model.rotary_emb)
    assert shared_prefix_verdict(model, _group_batch((3, 2)), 1.0, False) is False


def _engine(model: torch.nn.Module, trainable: bool = True, **spec: object):  # noqa: ANN202
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import MicroBatchSpec, TrainEngineConfig
    from areal_m2po.engine.train_engine import HFTrainEngine

    cfg = TrainEngineConfig(path="unused", mb_spec=MicroBatchSpec(**spec))
    return HFTrainEngine(cfg, Accelerator(cpu=True), 1, model=model, trainable=trainable)


def _count_tokens(model: torch.nn.Module, shapes: list | None = None) -> list[int]:
    """The input tokens of every call of ``model``'s forward, appended as they happen (and
    their ``[rows, columns]`` to ``shapes``)."""
    seen: list[int] = []

    def hook(_m: torch.nn.Module, _a: tuple, kw: dict) -> None:
        seen.append(int(kw["input_ids"].numel()))
        if shapes is not None:
            shapes.append(tuple(kw["input_ids"].shape))

    model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_engine_scores_each_prompt_once() -> None:
    batch = _group_batch((8, 8, 8), seed=7)
    start = int((~batch["loss_mask"].any(0)).sum())
    width = batch["input_ids"].shape[1] - start
    out = {}
    for shared in (False, True):
        model = _model()
        seen = _count_tokens(model)
        eng = _engine(model, trainable=False, shared_prefix=shared)
        out[shared] = eng.forward_tokens(batch, 1.0)[0]
        if shared:
            assert eng.checks.shared_prefix_ok is True
            # after the one-time check: 3 prompts once and 24 completions
            assert seen[-2:] == [3 * start, 24 * width]
        else:
            assert sum(seen) >= 24 * (start + 1)  # every row's prompt again
    mask = batch["loss_mask"]
    assert torch.allclose(out[True][mask], out[False][mask], atol=1e-5, rtol=0)


def test_engine_budget_splits_whole_groups() -> None:
    batch = _group_batch((8, 8, 8), seed=7)
    start = int((~batch["loss_mask"].any(0)).sum())
    width = batch["input_ids"].shape[1] - start
    model = _model()
    shapes: list = []
    _count_tokens(model, shapes)
    eng = _engine(model, trainable=False, shared_prefix_max_tokens_per_mb=start + 8 * width)
    eng.forward_tokens(batch, 1.0)
    # after the one-time check: per micro-batch one prompt, then its 8 completions
    assert [rows for rows, _ in shapes[-6:]] == [1, 8] * 3


def test_engine_scores_plainly_where_the_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import areal_m2po.engine.checked_forward as cf

    monkeypatch.setattr(cf, "shared_prefix_verdict", lambda *a, **k: False)
    batch = _group_batch((4, 4), seed=8)
    plain = _engine(_model(), trainable=False, shared_prefix=False).forward_tokens(batch, 1.0)
    eng = _engine(_model(), trainable=False)
    assert torch.equal(eng.forward_tokens(batch, 1.0)[0], plain[0])
    assert eng.checks.shared_prefix_ok is False


def _pg_loss(lp: torch.Tensor, ent: torch.Tensor, mb: dict[str, torch.Tensor]):  # noqa: ANN202
    m = mb["loss_mask"]
    return -(lp * mb["advantages"] * m).sum() / m.sum().clamp(min=1), {"ent": ent[m].mean()}


@pytest.mark.parametrize("budget", [None, 40])
def test_engine_trains_with_shared_prompts_as_without(budget: int | None) -> None:
    batch = _group_batch((4, 3, 5), seed=9, full=True)
    g = torch.Generator().manual_seed(0)
    batch["advantages"] = torch.randn(batch["loss_mask"].shape, generator=g) * batch["loss_mask"]
    params, stats, tokens = {}, {}, {}
    for shared in (False, True):
        model = _model().train()
        seen = _count_tokens(model)
        eng = _engine(model, shared_prefix_train=shared, max_tokens_per_mb=budget)
        eng.forward_tokens(batch, 1.0)  # the one-time checks, not counted below
        seen.clear()
        _, stats[shared] = eng.train_batch(batch, _pg_loss, lambda mb: float(mb["loss_mask"].sum()))
        params[shared] = torch.cat([p.detach().flatten() for p in eng.unwrapped.parameters()])
        tokens[shared] = sum(seen)
    assert torch.allclose(params[True], params[False], atol=1e-6, rtol=1e-5)
    assert abs(stats[True]["ent"] - stats[False]["ent"]) < 1e-5
    assert tokens[True] < tokens[False]  # the shared forward ran fewer tokens


def test_config_refuses_a_non_bool() -> None:
    from areal_m2po.api.cli_args import MicroBatchSpec

    with pytest.raises(ValueError, match="shared_prefix"):
        MicroBatchSpec(shared_prefix="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shared_prefix_max_tokens_per_mb"):
        MicroBatchSpec(shared_prefix_max_tokens_per_mb=0)


def test_a_frozen_copy_scores_to_the_bit() -> None:
    """A policy and its frozen copy (the reference) give the same bits, as the plain pass does:
    DPO's first evaluation, at pi = pi_ref, must see every pair tied."""
    import copy

    from areal_m2po.engine.train_engine import load_causal_lm

    model = load_causal_lm("builtin:tiny", "float32", "sdpa").eval()
    frozen = copy.deepcopy(model).requires_grad_(False)
    batch = _group_batch((2, 2, 2, 2), seed=11, max_prompt=12, max_new=6)
    batch["input_ids"] = batch["input_ids"] % model.config.vocab_size
    with torch.no_grad():
        a, _ = forward_logprobs_shared_prefix(model, batch, 1.0, False)
        b, _ = forward_logprobs_shared_prefix(frozen, batch, 1.0, False)
    assert torch.equal(a, b)
