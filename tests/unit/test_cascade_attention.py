"""Cascade attention (engine/cascade_attention.py): a prefix tree's levels kept once, the rows'
attention merged over levels by log-sum-exp, decoding in place, a head reused across the
micro-batches of a pass (``HeadStore``)."""

from __future__ import annotations

import pytest
import torch
from prefix_trees import INF, left_pad, rand_tokens, tiny_model, tree_batch, tree_prompts

from areal_m2po.engine import cascade_attention as ca
from areal_m2po.engine.forward import forward_logprobs
from areal_m2po.engine.shared_prefix import HeadStore, forward_logprobs_shared_prefix


def _reference(q, levels, own_k, own_v, scale):
    """Plain softmax over [each level's keys of the row's node ; own keys causally], built
    per row and per head with explicit copies (no grouping, no merging)."""
    b, hq, s, d = q.shape
    h = own_k.shape[1]
    t = own_k.shape[2]
    out = torch.zeros_like(q)
    for r in range(b):
        ks, vs, ok = [], [], []
        for k, v, mask, row in levels:
            ks.append(k[row[r]])
            vs.append(v[row[r]])
            ok.append(mask[row[r]][None].expand(s, -1))
        ks.append(own_k[r])
        vs.append(own_v[r])
        ok.append(torch.arange(t)[None, :] <= torch.arange(t - s, t)[:, None])
        kk, vv, allowed = torch.cat(ks, 1), torch.cat(vs, 1), torch.cat(ok, 1)
        for head in range(hq):
            scores = q[r, head] @ kk[head // (hq // h)].T * scale
            scores = scores.masked_fill(~allowed, float("-inf"))
            out[r, head] = torch.softmax(scores, -1) @ vv[head // (hq // h)]
    return out


def test_attention_over_levels_equals_one_softmax() -> None:
    """Two levels (one with an empty segment and unequal, interleaved groups of rows), 3 own
    columns of which 2 are queries, grouped query heads: within 1e-5 of one softmax over the
    copied keys; a wrong row-to-node map is not."""
    g = torch.Generator().manual_seed(0)
    h, hq, d, b = 2, 6, 8, 5

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    cache = ca.CascadeCache(1)
    k0, v0, m0 = rnd(2, h, 4, d), rnd(2, h, 4, d), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    k1, v1, m1 = rnd(3, h, 3, d), rnd(3, h, 3, d), torch.tensor([[1, 1, 1], [0, 0, 0], [1, 0, 0]])
    cache.own_layers[0].keys, cache.own_layers[0].values = [k0, k1], [v0, v1]
    row0, row1 = torch.tensor([1, 0, 1, 1, 0]), torch.tensor([2, 0, 1, 2, 2])
    cache.levels = [ca._grouped(m0.bool(), row0), ca._grouped(m1.bool(), row1)]
    cache.own_layers[0].update(rnd(b, h, 1, d), rnd(b, h, 1, d))
    kv = cache.own_layers[0].update(rnd(b, h, 2, d), rnd(b, h, 2, d))
    q = rnd(b, hq, 2, d)
    out, _ = ca.cascade_attention(torch.nn.Module(), q, kv, kv, None, scaling=0.3)
    layer = cache.own_layers[0]
    own_k, own_v = layer.own_k[:, :, :3], layer.own_v[:, :, :3]
    levels = [(k0, v0, m0.bool(), row0), (k1, v1, m1.bool(), row1)]
    want = _reference(q, levels, own_k, own_v, 0.3)
    torch.testing.assert_close(out.transpose(1, 2), want, atol=1e-5, rtol=0)
    cache.levels[1] = ca._grouped(m1.bool(), torch.tensor([2, 0, 1, 2, 0]))
    wrong, _ = ca.cascade_attention(torch.nn.Module(), q, kv, kv, None, scaling=0.3)
    assert float((wrong.transpose(1, 2) - want).abs().max()) > 1e-2


@pytest.mark.parametrize("threshold", [0, 8, INF])
@pytest.mark.parametrize("pad", [0, 3])
def test_both_caches_equal_the_plain_pass(threshold: float, pad: int) -> None:
    """Several levels, padding on either side: the cascade pass and the copied-cache pass both
    within 1e-5 of the plain pass, and the cascade pass runs the model under its name."""
    model = tiny_model()
    batch = tree_batch(tree_prompts(), [3, 1, 2, 2, 1], pad=pad)
    seen: list[str] = []
    model.model.layers[0].register_forward_pre_hook(
        lambda m, a: seen.append(m.self_attn.config._attn_implementation)
    )
    mask = batch["loss_mask"]
    with torch.no_grad():
        plain, plain_ent = forward_logprobs(model, batch, 1.0, True)
        for cascade in (True, False):
            seen.clear()
            got, ent = forward_logprobs_shared_prefix(model, batch, 1.0, True, threshold, cascade)
            torch.testing.assert_close(got[mask], plain[mask], atol=1e-5, rtol=0)
            torch.testing.assert_close(ent[mask], plain_ent[mask], atol=1e-5, rtol=0)
            assert set(seen) == {ca.CASCADE if cascade else "sdpa"}
    assert model.config._attn_implementation == "sdpa"  # restored


def test_a_plain_forward_under_the_cascade_name_keeps_its_mask() -> None:
    """A forward with an ordinary cache while the model runs under the cascade name (another
    thread's pass on a shared model) still gets its padding mask: the sdpa result."""
    model = tiny_model()
    batch = tree_batch(tree_prompts(), [2, 1, 1, 1, 1], pad=2)
    with torch.no_grad():
        want, _ = forward_logprobs(model, batch, 1.0, False)
        with ca.cascade_mode(model):
            got, _ = forward_logprobs(model, batch, 1.0, False)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("cascade", "n"), [(True, 1), (True, 3), (False, 2)])
def test_greedy_generation_on_either_cache(cascade: bool, n: int) -> None:
    """Greedy tokens token for token as plain ``generate``, on the cascade cache (decoded into
    a buffer that grows past its capacity: ``max_new_tokens`` unset) and on the copied one."""
    from transformers import GenerationConfig

    from areal_m2po.rollout.engines.shared_prefill import generate_shared_prefill

    model = tiny_model()
    ids, attn = left_pad(tree_prompts())
    cfg = GenerationConfig(max_length=ids.shape[1] + 9, do_sample=False, pad_token_id=0)
    ids, attn = ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
    plain = model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg)
    shared = generate_shared_prefill(model, ids[::n], attn[::n], cfg, n, 0, cascade)
    assert torch.equal(shared, plain)
    assert model.config._attn_implementation == "sdpa"


def _store_batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    head = rand_tokens(g, 60)
    return tree_batch([head + rand_tokens(g, k) for k in (3, 5, 2, 4)], [2, 2, 2, 2], pad=2)


def test_a_head_is_reused_across_micro_batches() -> None:
    """Two micro-batches whose prompts share a 60-token head: with one ``HeadStore`` the second
    runs only its tails (counted at the embedding) and both equal the plain pass."""
    model = tiny_model()
    batch = _store_batch()
    tokens: list[int] = []
    model.model.embed_tokens.register_forward_hook(
        lambda _m, a, _o: tokens.append(int(a[0].numel()))
    )
    store = HeadStore()
    got = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        want, _ = forward_logprobs(model, batch, 1.0, False)
        for idx in (torch.arange(4), torch.arange(4, 8)):
            mb = {k: v[idx] for k, v in batch.items()}
            tokens.clear()
            got[idx] = forward_logprobs_shared_prefix(model, mb, 1.0, False, head_store=store)[0]
            assert tokens[0] == (60 if idx[0] == 0 else 2 * 4)  # the head, then 2 tails of 4
    assert len(store.tokens) == 60 and store.keys[0].shape[2] == 60
    mask = batch["loss_mask"]
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


def test_a_store_from_other_weights_shows() -> None:
    """The store is only valid for the weights that filled it: fed another model's head, the
    log-probs move (what one store per pass guards against)."""
    batch = _store_batch()
    store = HeadStore()
    with torch.no_grad():
        forward_logprobs_shared_prefix(tiny_model(), batch, 1.0, False, head_store=store)
        other = tiny_model()
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
        want, _ = forward_logprobs(other, batch, 1.0, False)
        got, _ = forward_logprobs_shared_prefix(other, batch, 1.0, False, head_store=store)
    assert float((got - want)[batch["loss_mask"]].abs().max()) > 1e-3


def test_reusable_length() -> None:
    """At least MIN_SAVED_TOKENS shared with every prompt, each prompt keeping a token."""
    store = HeadStore(tokens=list(range(100)))
    assert store.reusable([list(range(70)), list(range(50)) + [7]]) == 50
    assert store.reusable([list(range(45))]) == 44
    assert store.reusable([list(range(30)) + [1] * 20]) == 0  # 30 < 40
    assert store.reusable([list(range(90)), [5] + list(range(60))]) == 0
