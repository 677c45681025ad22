"""Prompts grouped by their common prefixes (engine/prefix_tree.py) in scoring and generation,
against the plain pass and plain ``generate``."""

from __future__ import annotations

import pytest
import torch
from prefix_trees import INF, left_pad, rand_tokens, tiny_model, tree_batch, tree_prompts

from areal_m2po.engine import shared_prefix
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.forward import forward_logprobs
from areal_m2po.engine.prefix_tree import build_prefix_levels, common_prefix
from areal_m2po.engine.shared_prefix import (
    forward_logprobs_shared_prefix,
    prompt_index,
    shared_prefix_verdict,
    split_prompt_groups,
)


def test_levels_of_a_hand_built_tree() -> None:
    """Derived by hand: [1,2] heads four sequences, [3] three of them, [4] two; [1,2] itself
    and [9,8] continue through empty segments; duplicates share a leaf."""
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 7], [1, 2, 3, 7], [9, 8], [1, 2]]
    tree = build_prefix_levels(seqs, 0)
    got = [(lv.ids.tolist(), lv.mask.tolist(), lv.parent.tolist(), lv.offset.tolist())
           for lv in tree.levels]  # fmt: skip
    assert got == [
        ([[1, 2], [9, 8]], [[1, 1], [1, 1]], [0, 1], [0, 0]),
        ([[3], [0], [0]], [[1], [0], [0]], [0, 0, 1], [2, 2, 2]),
        ([[4], [7], [0], [0]], [[1], [1], [0], [0]], [0, 0, 1, 2], [3, 3, 2, 2]),
        ([[5], [6], [0], [0], [0]], [[1], [1], [0], [0], [0]], [0, 0, 1, 2, 3], [4, 4, 4, 2, 2]),
    ]
    assert tree.leaf.tolist() == [0, 1, 2, 2, 4, 3]
    assert (tree.computed, tree.total) == (9, 22)


def test_levels_rebuild_every_sequence() -> None:
    """Following ``parent`` up from each leaf and joining the real tokens gives the sequence
    back, at the positions ``offset`` says, whatever the threshold."""
    seqs = tree_prompts() + tree_prompts(seed=3)[:2]
    for threshold in (0, 10, 40, INF):
        tree = build_prefix_levels(seqs, threshold)
        for i, s in enumerate(seqs):
            node, parts = int(tree.leaf[i]), []
            for lv in reversed(tree.levels):
                real = lv.ids[node][lv.mask[node].bool()].tolist()
                assert int(lv.offset[node]) == len(s) - len(real) - sum(len(p) for p in parts)
                parts.insert(0, real)
                node = int(lv.parent[node])
            assert sum(parts, []) == s, (threshold, i)


def test_a_run_that_saves_too_little_is_not_split_out() -> None:
    """Two sequences sharing 10 tokens save 10 computations: split at a threshold of 10,
    one level of the two whole sequences above it; an infinite threshold never splits."""
    seqs = [list(range(3, 13)) + [20, 21], list(range(3, 13)) + [30]]
    assert len(build_prefix_levels(seqs, 10).levels) == 2
    assert build_prefix_levels(seqs, 10).computed == 13
    flat = build_prefix_levels(seqs, 11)
    assert len(flat.levels) == 1 and flat.computed == 23
    assert build_prefix_levels(seqs + seqs, INF).leaf.tolist() == [0, 1, 0, 1]


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        build_prefix_levels([[1], []])
    with pytest.raises(ValueError, match="no sequences"):
        build_prefix_levels([])
    assert common_prefix([1, 2, 3], [1, 2]) == 2 and common_prefix([], [1]) == 0


@pytest.mark.parametrize("threshold", [0, 8, INF])
@pytest.mark.parametrize("pad", [0, 3])
def test_equals_the_plain_pass(threshold: float, pad: int) -> None:
    """Several levels, a prompt that is another's prefix, padding on either side: the
    log-probs and entropies within 1e-5 of the plain pass."""
    model = tiny_model()
    batch = tree_batch(tree_prompts(), [3, 1, 2, 2, 1], pad=pad)
    with torch.no_grad():
        plain, plain_ent = forward_logprobs(model, batch, 1.0, True)
        shared, shared_ent = forward_logprobs_shared_prefix(model, batch, 1.0, True, threshold)
    mask = batch["loss_mask"]
    torch.testing.assert_close(shared[mask], plain[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(shared_ent[mask], plain_ent[mask], atol=1e-5, rtol=0)


def test_wrong_positions_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every segment continued on a cache at positions one off (a uniform shift of all
    positions would change nothing under rotary embeddings): the pass no longer equals the
    plain one, and the one-time check refuses it (while it accepts the right positions)."""
    model = tiny_model()
    with torch.no_grad():  # sharper attention: the random tiny model hardly sees positions
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    batch = tree_batch(tree_prompts(), [3, 1, 2, 2, 1])
    assert shared_prefix_verdict(model, batch, 1.0, False) is True
    right = shared_prefix.level_positions
    monkeypatch.setattr(shared_prefix, "level_positions", lambda m, o: right(m, o + (o > 0)))
    with torch.no_grad():
        plain, _ = forward_logprobs(model, batch, 1.0, False)
        shifted, _ = forward_logprobs_shared_prefix(model, batch, 1.0, False, 0)
    mask = batch["loss_mask"]
    assert float((plain - shifted)[mask].abs().max()) > 5e-3
    assert shared_prefix_verdict(model, batch, 1.0, False) is False


def test_budget_counts_a_shared_head_once() -> None:
    """Prompts of 17 tokens sharing 12, completions of 6 columns: a group of 2 rows costs
    17 + 12 alone and 5 + 12 beside another, so a budget of 29 + 17 holds two groups."""
    g = torch.Generator().manual_seed(0)
    head = rand_tokens(g, 12)
    prompts = [head + rand_tokens(g, 5) for _ in range(4)]
    batch = tree_batch(prompts, [2, 2, 2, 2])
    start, prompt_of_row = prompt_index(batch)
    idx = split_prompt_groups(batch, prompt_of_row, start, 46)
    assert [i.tolist() for i in idx] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    idx = split_prompt_groups(batch, prompt_of_row, start, 45)
    assert [i.tolist() for i in idx] == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize(("threshold", "n"), [(0, 1), (INF, 1), (0, 3), (8, 2)])
def test_greedy_generation_equals_plain_generate(threshold: float, n: int) -> None:
    """Prompts sharing heads at several levels, left-padded, ``n`` samples each: the same
    greedy tokens as plain ``generate`` of each prompt repeated, token for token, in the
    prompts' own layout."""
    from transformers import GenerationConfig

    from areal_m2po.rollout.engines.shared_prefill import generate_shared_prefill

    model = tiny_model()
    ids, attn = left_pad(tree_prompts())
    cfg = GenerationConfig(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=[1])
    ids, attn = ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
    plain = model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg)
    shared = generate_shared_prefill(model, ids[::n], attn[::n], cfg, n, min_saved_tokens=threshold)
    assert shared.shape == plain.shape and torch.equal(shared, plain)


def test_sampling_with_a_shared_head_equals_plain_generate() -> None:
    """Sampled with one seed: the same tokens, per-step logits within 1e-5."""
    from transformers import GenerationConfig

    from areal_m2po.rollout.engines.shared_prefill import generate_shared_prefill

    model = tiny_model()
    ids, attn = left_pad(tree_prompts(seed=4))
    cfg = GenerationConfig(
        max_new_tokens=6,
        do_sample=True,
        top_k=None,
        top_p=1.0,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
        eos_token_id=[1],
    )
    plain_cfg = GenerationConfig(**{**cfg.to_dict(), "num_return_sequences": 4})
    torch.manual_seed(5)
    plain = model.generate(input_ids=ids, attention_mask=attn, generation_config=plain_cfg)
    torch.manual_seed(5)
    shared = generate_shared_prefill(model, ids, attn, cfg, 4, min_saved_tokens=0)
    assert torch.equal(plain.sequences, shared.sequences)
    for a, b in zip(plain.logits, shared.logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_hf_generator_greedy_with_a_long_system_prompt() -> None:
    """The HF engine (sync, server, evaluation) over prompts with a 100-token common system
    prompt, split out at the default threshold: the batch plain ``generate`` gives."""
    from areal_m2po.api.cli_args import GenerationConfig
    from areal_m2po.rollout.engines.hf_generator import HFGenerator
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    model = build_tiny_llama(len(tok), 0, hidden_size=32, intermediate_size=64).eval()
    g = torch.Generator().manual_seed(7)
    system = rand_tokens(g, 100)
    prompts = [system + rand_tokens(g, k) for k in (3, 5, 2, 4)]
    assert build_prefix_levels([p[:-1] for p in prompts]).computed < 120  # split out
    gen = HFGenerator(model, tok, torch.device("cpu"))
    got = gen.generate(prompts, GenerationConfig(max_new_tokens=6), greedy=True)
    ids, attn = left_pad(prompts)
    pad = tok.pad_token_id
    want = model.generate(input_ids=ids.masked_fill(attn == 0, pad), attention_mask=attn,
                          max_new_tokens=6, do_sample=False, pad_token_id=pad,
                          eos_token_id=[tok.eos_token_id])  # fmt: skip
    p = ids.shape[1]
    assert torch.equal(got["input_ids"][:, :p][attn.bool()], ids[attn.bool()])
    c = want.shape[1] - p
    assert torch.equal(got["input_ids"][:, p : p + c], want[:, p:])


@pytest.mark.parametrize("cascade", [True, False])
def test_gradients_through_several_levels_equal_the_plain_pass(cascade: bool) -> None:
    """Training with shared prompts (``shared_prefix_train``): the gradient flows through every
    level's cache (kept once, or copied per row) to the shared tokens, as through the plain
    pass, finite also through a carried-down empty segment."""
    batch = tree_batch(tree_prompts(), [3, 1, 2, 2, 1])
    grads = []
    for shared in (False, True):
        model = tiny_model()
        if shared:
            logp, _ = forward_logprobs_shared_prefix(model, batch, 1.0, False, 0, cascade)
        else:
            logp, _ = forward_logprobs(model, batch, 1.0, False)
        (logp * batch["loss_mask"]).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_engine_shares_a_system_prompt_among_distinct_prompts() -> None:
    """One row per prompt (as a teacher or an n=1 pass sees them), a 50-token common head: the
    engine's no-grad pass takes the shared path (the head once, then the distinct tails, then
    the completions) and equals the plain pass; heads too short to pay are scored plainly."""
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import MicroBatchSpec, TrainEngineConfig
    from areal_m2po.engine.shared_prefix import shared_prefix_split
    from areal_m2po.engine.train_engine import HFTrainEngine

    g = torch.Generator().manual_seed(2)
    head = rand_tokens(g, 50)
    batch = tree_batch([head + rand_tokens(g, 3 + i) for i in range(4)], [1, 1, 1, 1])
    short = tree_batch([head[:5] + rand_tokens(g, 3 + i) for i in range(4)], [1, 1, 1, 1])
    assert shared_prefix_split(short, None) is None  # saves 15 < 40 tokens
    out = {}
    for on in (False, True):
        model = tiny_model()
        calls: list[tuple[int, ...]] = []
        model.register_forward_pre_hook(
            lambda _m, _a, kw, calls=calls: calls.append(tuple(kw["input_ids"].shape)),
            with_kwargs=True,
        )
        cfg = TrainEngineConfig(path="unused", mb_spec=MicroBatchSpec(shared_prefix=on))
        eng = HFTrainEngine(cfg, Accelerator(cpu=True), 1, model=model, trainable=False)
        out[on] = eng.forward_tokens(batch, 1.0)[0]
        if on:
            assert eng.checks.shared_prefix_ok is True
            assert [rows for rows, _ in calls[-3:]] == [1, 4, 4]  # head, tails, completions
    mask = batch["loss_mask"]
    torch.testing.assert_close(out[True][mask], out[False][mask], atol=1e-5, rtol=0)
