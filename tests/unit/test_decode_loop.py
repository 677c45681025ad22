"""The own decode loop (rollout/engines/decode_loop.py) and its sampler (sampling.py): rows
leave the batch as they end, against plain HF ``generate`` (greedy), an independent forward
pass (behaviour log-probs) and exact probabilities (the sampler)."""

from __future__ import annotations

import math

import pytest
import torch
from prefix_trees import VOCAB, left_pad, rand_tokens, tiny_model, tree_prompts

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.rollout.engines.decode_loop import decode
from areal_m2po.rollout.engines.hf_generator import HFGenerator
from areal_m2po.rollout.engines.sampling import next_tokens
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

INF = float("inf")


def _model() -> torch.nn.Module:
    """A tiny Llama with large weights: its greedy text varies (with the default scale each
    row repeats its last token), so EOS ids end rows at different steps."""
    return build_tiny_llama(
        VOCAB, 0, hidden_size=32, intermediate_size=64, max_position_embeddings=256,
        initializer_range=0.5,
    ).eval()  # fmt: skip


# -- the sampler ---------------------------------------------------------------------------


def test_greedy_takes_the_first_maximum() -> None:
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 0.0]])
    tokens, logp = next_tokens(logits, None)
    assert tokens.tolist() == [1, 0] and logp.tolist() == [0.0, 0.0]


def test_draws_follow_the_softmax_exactly() -> None:
    """200,000 draws of a distribution derived by hand, p = (1/2, 1/4, 1/8, 1/8, 0): every
    frequency within 5 standard errors, the zero-probability token never drawn, and the same
    draws again from the same seed."""
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125, 0.0])
    logits = (probs.log() + 3.0).expand(200_000, -1)  # log 0 = -inf: never drawn
    g = torch.Generator().manual_seed(0)
    tokens, logp = next_tokens(logits, 1.0, g)
    counts = torch.bincount(tokens, minlength=5).double() / tokens.numel()
    se = (probs.double() * (1 - probs.double()) / tokens.numel()).sqrt()
    assert counts[4] == 0
    assert bool(((counts - probs.double()).abs() <= 5 * se + 1e-12).all()), counts
    torch.testing.assert_close(logp, probs.log()[tokens], atol=1e-6, rtol=0)
    again, _ = next_tokens(logits, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(again, tokens)


def test_temperature_scales_the_logits() -> None:
    """At T = 2 the logits (0, 2 ln 2) give p = (1/3, 2/3); the log-prob is
    ``x / T - logsumexp(x / T)`` in float32."""
    logits = torch.tensor([[0.0, 2 * math.log(2.0)]]).expand(60_000, -1)
    tokens, logp = next_tokens(logits, 2.0, torch.Generator().manual_seed(1))
    share = tokens.double().mean().item()
    assert abs(share - 2 / 3) < 5 * math.sqrt(2 / 9 / 60_000)
    scaled = logits / 2.0
    want = (scaled.gather(-1, tokens[:, None]) - scaled.logsumexp(-1, keepdim=True))[:, 0]
    assert torch.equal(logp, want)  # the recorder's arithmetic before, bit for bit
    torch.testing.assert_close(logp, torch.tensor([1 / 3, 2 / 3]).log()[tokens])


def test_bad_logits_and_temperature_are_refused() -> None:
    logits = torch.zeros(3, 4)
    logits[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        next_tokens(logits, 1.0)
    with pytest.raises(ValueError, match=r"rows \[0\]"):
        next_tokens(torch.full((1, 4), float("-inf")), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        next_tokens(torch.zeros(1, 4), 0.0)


# -- the loop ------------------------------------------------------------------------------


def _plain_generate(model, prompts, n, max_new, eos):
    from transformers import GenerationConfig as HFConfig

    ids, attn = left_pad(prompts)
    cfg = HFConfig(max_new_tokens=max_new, do_sample=False, pad_token_id=0, eos_token_id=eos)
    ids, attn = ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
    return model.generate(input_ids=ids, attention_mask=attn, generation_config=cfg)[
        :, ids.shape[1] :
    ]


@pytest.mark.parametrize(("threshold", "n"), [(0, 1), (0, 3), (INF, 2), (8, 1)])
def test_greedy_equals_plain_generate_as_rows_end(threshold: float, n: int) -> None:
    """Prompts sharing heads at several levels, left-padded: with EOS ids the rows emit at
    different steps (rows leave the batch one by one, nodes leave the levels), the tokens
    equal plain ``generate``'s, padding after each row's end included."""
    model = _model()
    prompts = tree_prompts()
    free = _plain_generate(model, prompts, 1, 10, [1])
    # EOS ids the rows reach at different steps
    eos = sorted({int(free[2, 3]), int(free[3, 2])})
    want = _plain_generate(model, prompts, n, 10, eos)
    got, logp = decode(model, prompts, n, 10, None, eos, 0, threshold)
    assert torch.equal(got, want)
    assert not logp.any()
    ends = [int(torch.isin(row, torch.tensor(eos)).nonzero()[0]) for row in got[::n][[0, 2, 4]]]
    assert len(set(ends)) > 1  # rows did end at different steps
    assert model.config._attn_implementation == "sdpa"


def _reference_logp(model, prompts, n, tokens, temperature):
    """log softmax(logits / T) of every generated token, one forward pass per row."""
    out = torch.zeros(tokens.shape)
    for r in range(tokens.shape[0]):
        seq = torch.tensor(prompts[r // n] + tokens[r].tolist())[None]
        with torch.no_grad():
            logits = model(input_ids=seq).logits[0].float() / temperature
        lp = torch.log_softmax(logits, -1)
        p = len(prompts[r // n])
        out[r] = lp[p - 1 : -1].gather(-1, tokens[r][:, None])[:, 0]
    return out


def test_sampled_logprobs_equal_a_forward_pass() -> None:
    """Sampling at T = 0.7 with an EOS that ends rows early: each row's behaviour log-probs
    equal those of an independent forward pass up to its end, 0 after, padding after it
    (the default weights: logits of order one, whose float rounding stays below 1e-5)."""
    model = tiny_model()
    prompts = tree_prompts(seed=3)
    torch.manual_seed(0)
    tokens, logp = decode(model, prompts, 4, 8, 0.7, [5, 9, 11], 0, 0)
    ref = _reference_logp(model, prompts, 4, tokens, 0.7)
    is_eos = torch.isin(tokens, torch.tensor([5, 9, 11]))
    after = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    assert after.any()  # some row ended early
    assert not logp[after].any() and bool((tokens[after] == 0).all())
    torch.testing.assert_close(logp[~after], ref[~after], atol=1e-5, rtol=0)


def test_a_stop_check_ends_single_rows() -> None:
    """A stop check ending row 1 after 2 tokens and row 3 after 4: those rows hold pad after,
    the others go on as without it."""
    model = _model()
    prompts = tree_prompts()[:4]
    free, _ = decode(model, prompts, 1, 7, None, [1], 0, 0)

    def stop(active: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        k = generated.shape[1]
        return ((active == 1) & (k == 2)) | ((active == 3) & (k == 4))

    got, _ = decode(model, prompts, 1, 7, None, [1], 0, 0, stop)
    assert torch.equal(got[1, :2], free[1, :2]) and not got[1, 2:].any()
    assert torch.equal(got[3, :4], free[3, :4]) and not got[3, 4:].any()
    assert torch.equal(got[[0, 2]], free[[0, 2]])


def test_hf_generator_uses_the_loop_and_hf_generate_alike() -> None:
    """The HF engine's batch is the same through the loop and through HF ``generate``
    (greedy, a 40-token common head, stop strings): the loop is a drop-in."""
    tok = build_tiny_tokenizer()
    model = build_tiny_llama(len(tok), 0, hidden_size=32, intermediate_size=64).eval()
    g = torch.Generator().manual_seed(7)
    head = rand_tokens(g, 40)
    prompts = [head + rand_tokens(g, k) for k in (3, 5, 2, 4)]
    gen = HFGenerator(model, tok, torch.device("cpu"))
    cfg = GenerationConfig(max_new_tokens=9, stop=["a", "e"])
    loop = gen.generate(prompts, cfg, greedy=True)
    gen.decode_loop = False
    hf = gen.generate(prompts, cfg, greedy=True)
    for key in loop:
        assert torch.equal(loop[key], hf[key]), key


@pytest.mark.parametrize("loop", [True, False])
def test_sampling_draws_from_the_whole_vocabulary(loop: bool) -> None:
    """``top_k: 0`` means no top-k on either path. transformers 5 reads ``top_k=None`` as
    unset and applies its default of 50; that drew 50 distinct first tokens at most, while
    the behaviour log-probs are of the full softmax. At T = 20 over 99 tokens, 512 draws
    cover nearly all of them."""
    tok = build_tiny_tokenizer()
    model = build_tiny_llama(len(tok), 0, hidden_size=32, intermediate_size=64).eval()
    gen = HFGenerator(model, tok, torch.device("cpu"))
    gen.decode_loop = loop
    cfg = GenerationConfig(n_samples=512, max_new_tokens=1, temperature=20.0)
    batch = gen.generate([[5, 6, 7, 8]], cfg, seed=0)
    first = batch["input_ids"][:, 4]
    assert len(set(first.tolist())) > 60
