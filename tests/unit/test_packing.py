"""Sequence packing: the packed training forward equals the padded one (values and gradients)."""

from __future__ import annotations

import copy

import pytest
import torch

from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.forward import forward_logprobs, forward_logprobs_packed
from areal_m2po.engine.packing import pack_micro_batch


def _tiny_llama(attn: str = "sdpa", vocab: int = 97, seed: int = 0) -> torch.nn.Module:
    model = build_tiny_llama(
        vocab,
        seed,
        hidden_size=32,
        intermediate_size=64,
        max_position_embeddings=256,
        attn_implementation=attn,
    )
    model.eval()  # no dropout anyway; keeps the comparison deterministic
    return model


def _rollout_batch(
    n: int = 7, vocab: int = 97, seed: int = 0, max_prompt: int = 9, max_new: int = 8
) -> dict[str, torch.Tensor]:
    """The rollout layout: left-padded prompts, completions from a common column, right pad."""
    g = torch.Generator().manual_seed(seed)
    p_lens = torch.randint(1, max_prompt + 1, (n,), generator=g)
    c_lens = torch.randint(1, max_new + 1, (n,), generator=g)
    c_lens[0] = max_new  # at least one row fills the completion block
    p_max, t = int(p_lens.max()), int(p_lens.max()) + max_new
    ids = torch.zeros(n, t, dtype=torch.long)
    attn = torch.zeros(n, t, dtype=torch.bool)
    loss = torch.zeros(n, t, dtype=torch.bool)
    for i in range(n):
        p, c = int(p_lens[i]), int(c_lens[i])
        ids[i, p_max - p : p_max + c] = torch.randint(3, vocab, (p + c,), generator=g)
        attn[i, p_max - p : p_max + c] = True
        loss[i, p_max : p_max + c] = True
    return {
        "input_ids": ids,
        "attention_mask": attn,
        "loss_mask": loss,
        "advantages": torch.randn(n, t, generator=g) * loss,
    }


def test_layout_roundtrip() -> None:
    batch = _rollout_batch(n=9, seed=3)
    for single in (False, True):
        lay = pack_micro_batch(
            batch["input_ids"], batch["attention_mask"], batch["loss_mask"], single_row=single
        )
        # every real token packed once, no row wider than the longest sequence (multi-row)
        assert lay.n_real == int(batch["attention_mask"].sum())
        longest = int(batch["attention_mask"].sum(1).max())
        assert lay.shape[1] == (lay.n_real if single else longest)
        if single:
            assert lay.shape[0] == 1
        # labels are the loss tokens, in the kept positions' order
        assert torch.equal(lay.labels, batch["input_ids"][lay.dst_rows, lay.dst_cols])
        assert int(lay.logits_to_keep.sum()) == int(batch["loss_mask"].sum())
        # the token after each kept position is the label, at the next position id
        flat_keep = lay.logits_to_keep.reshape(-1).nonzero().squeeze(1)
        assert torch.equal(lay.input_ids.reshape(-1)[flat_keep + 1], lay.labels)
        pos = lay.position_ids.reshape(-1)
        assert torch.equal(pos[flat_keep + 1], pos[flat_keep] + 1)
        assert int(lay.cu_seqlens[-1]) == lay.input_ids.numel()


def test_transformers_detects_packing_from_position_ids() -> None:
    """The block-diagonal mask comes from transformers itself (attention_mask=None)."""
    from transformers.masking_utils import find_packed_sequence_indices

    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    seg = find_packed_sequence_indices(pos)
    assert seg is not None and seg.tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 2]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_equals_padded_with_gradients(attn: str, temperature: float) -> None:
    torch.manual_seed(0)
    model_pad = _tiny_llama(attn)
    model_pack = copy.deepcopy(model_pad)
    batch = _rollout_batch(n=7, seed=1)
    mask = batch["loss_mask"]

    lp_pad, ent_pad = forward_logprobs(model_pad, batch, temperature, True)
    lp_pack, ent_pack = forward_logprobs_packed(model_pack, batch, temperature, True)
    torch.testing.assert_close(lp_pack[mask], lp_pad[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_pack[mask], ent_pad[mask], atol=1e-5, rtol=0)
    assert bool((lp_pack[~mask] == 0).all()) and bool((ent_pack[~mask] == 0).all())

    def loss(lp: torch.Tensor) -> torch.Tensor:
        return -(lp * batch["advantages"] * mask).sum() / mask.sum()

    loss(lp_pad).backward()
    loss(lp_pack).backward()
    for (name, p_pad), p_pack in zip(model_pad.named_parameters(), model_pack.parameters()):
        assert p_pad.grad is not None and p_pack.grad is not None, name
        torch.testing.assert_close(p_pack.grad, p_pad.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_without_logits_to_keep_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Older transformers (no boolean ``logits_to_keep``): full logits, then the kept rows."""
    from areal_m2po.engine import forward

    monkeypatch.setattr(forward, "_LOGITS_TO_KEEP_MASK", False)
    model = _tiny_llama()
    batch = _rollout_batch(n=6, seed=5)
    mask = batch["loss_mask"]
    with torch.no_grad():
        lp_pad, ent_pad = forward_logprobs(model, batch, 1.0, True)
        lp_pack, ent_pack = forward_logprobs_packed(model, batch, 1.0, True)
    torch.testing.assert_close(lp_pack[mask], lp_pad[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_pack[mask], ent_pad[mask], atol=1e-5, rtol=0)


def test_packed_no_grad_and_edge_cases() -> None:
    model = _tiny_llama()
    batch = _rollout_batch(n=5, seed=2)
    # a row with no real tokens and a row without loss tokens are left at zero
    batch["attention_mask"][1] = False
    batch["loss_mask"][1] = False
    batch["loss_mask"][2] = False
    with torch.no_grad():
        lp_pad, _ = forward_logprobs(model, batch, 1.0, False)
        lp_pack, ent = forward_logprobs_packed(model, batch, 1.0, False)
    mask = batch["loss_mask"]
    torch.testing.assert_close(lp_pack[mask], lp_pad[mask], atol=1e-5, rtol=0)
    assert bool((lp_pack[1:3] == 0).all()) and bool((ent == 0).all())
    # nothing to score at all
    empty = {k: v.clone() for k, v in batch.items()}
    empty["loss_mask"][:] = False
    with torch.no_grad():
        lp, _ = forward_logprobs_packed(model, empty, 1.0, True)
    assert bool((lp == 0).all())


def test_engine_packing_option_trains_identically() -> None:
    """One optimizer step through HFTrainEngine with and without packing: same weights."""
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import MicroBatchSpec, TrainEngineConfig
    from areal_m2po.engine.train_engine import HFTrainEngine

    if "packing" not in {f for f in MicroBatchSpec.__dataclass_fields__}:
        pytest.skip("MicroBatchSpec has no packing field")
    acc = Accelerator(cpu=True)
    base = _tiny_llama()
    batch = _rollout_batch(n=8, seed=4)
    mask = batch["loss_mask"]

    def loss_fn(lp: torch.Tensor, ent: torch.Tensor, mb: dict[str, torch.Tensor]):
        m = mb["loss_mask"]
        return -(lp * mb["advantages"] * m).sum() / m.sum().clamp(min=1), {}

    params = {}
    for packing in (False, True):
        cfg = TrainEngineConfig(path="unused", mb_spec=MicroBatchSpec(n_mbs=3, packing=packing))
        eng = HFTrainEngine(cfg, acc, total_steps=1, model=copy.deepcopy(base))
        eng.train_batch(batch, loss_fn, lambda mb: float(mb["loss_mask"].sum()))
        params[packing] = [p.detach().clone() for p in eng.unwrapped.parameters()]
        with torch.no_grad():
            params[(packing, "lp")] = eng.forward_tokens(batch, 1.0)[0]
    for a, b in zip(params[False], params[True]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        params[(True, "lp")][mask], params[(False, "lp")][mask], atol=1e-5, rtol=0
    )


def test_engine_falls_back_when_packing_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model whose attention ignores the packed boundaries is caught and trained padded."""
    import transformers.masking_utils as mu
    from accelerate import Accelerator

    from areal_m2po.api.cli_args import MicroBatchSpec, TrainEngineConfig
    from areal_m2po.engine.train_engine import HFTrainEngine

    if "packing" not in {f for f in MicroBatchSpec.__dataclass_fields__}:
        pytest.skip("MicroBatchSpec has no packing field")
    batch = _rollout_batch(n=6, seed=6)
    cfg = TrainEngineConfig(path="unused", mb_spec=MicroBatchSpec(packing=True))
    good = HFTrainEngine(cfg, Accelerator(cpu=True), 1, model=_tiny_llama(), trainable=False)
    good.forward_tokens(batch, 1.0)
    assert good.checks.packing_ok is True

    # without packed-sequence detection every row is one causal sequence: packing leaks
    monkeypatch.setattr(mu, "find_packed_sequence_indices", lambda position_ids: None)
    bad = HFTrainEngine(cfg, Accelerator(cpu=True), 1, model=_tiny_llama(), trainable=False)
    lp, _ = bad.forward_tokens(batch, 1.0)
    assert bad.checks.packing_ok is False
    with torch.no_grad():
        ref, _ = forward_logprobs(bad.model, batch, 1.0, False)
    mask = batch["loss_mask"]
    torch.testing.assert_close(lp[mask], ref[mask], atol=1e-6, rtol=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prefill_generation_equals_plain_generate(temperature: float) -> None:
    """Prompts encoded once then the cache repeated: same tokens and per-step logits."""
    from transformers import GenerationConfig

    from areal_m2po.rollout.engines.shared_prefill import generate_shared_prefill

    model = _tiny_llama(vocab=97)
    p, length, n = 3, 7, 4
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 97, (p, length), generator=g)
    attn = torch.ones(p, length, dtype=torch.long)
    ids[0, :3], attn[0, :3] = 0, 0  # left padding
    cfg = GenerationConfig(
        max_new_tokens=6,
        do_sample=True,
        temperature=temperature,
        top_k=None,
        top_p=1.0,
        return_dict_in_generate=True,
        output_logits=True,
        pad_token_id=0,
        eos_token_id=[1],
    )
    plain_cfg = GenerationConfig(**{**cfg.to_dict(), "num_return_sequences": n})
    torch.manual_seed(5)
    plain = model.generate(input_ids=ids, attention_mask=attn, generation_config=plain_cfg)
    torch.manual_seed(5)
    shared = generate_shared_prefill(model, ids, attn, cfg, n)
    assert torch.equal(plain.sequences, shared.sequences)
    assert len(plain.logits) == len(shared.logits)
    for a, b in zip(plain.logits, shared.logits):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_shared_prefill_uses_the_cache_name_of_this_transformers(caplog) -> None:
    """No ``past_key_values``/``cache_params are deprecated`` warning: the cache is read from
    the output and passed to ``generate`` under the name this transformers' forward takes."""
    import logging

    from transformers import GenerationConfig

    from areal_m2po.rollout.engines.shared_prefill import generate_shared_prefill

    model = _tiny_llama(vocab=97)
    ids = torch.randint(3, 97, (2, 5), generator=torch.Generator().manual_seed(0))
    cfg = GenerationConfig(max_new_tokens=3, do_sample=False, pad_token_id=0, eos_token_id=[1])
    warning_once = getattr(logging.Logger, "warning_once", None)
    if warning_once is not None:  # transformers warns once per process: forget earlier ones
        warning_once.cache_clear()
    with caplog.at_level(logging.WARNING):
        generate_shared_prefill(model, ids, torch.ones_like(ids), cfg, 2)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "deprecated" in m], messages
