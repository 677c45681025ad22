"""A row ended by a stop string, with pad equal to EOS (SmolLM2, the tiny tokenizer): the pad
that HF fills in after the stop string is not a generated EOS."""

from __future__ import annotations

import asyncio

import torch
from agentic_helpers import tiny_model_and_tokenizer

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.rollout.engines.hf import HFInProcessEngine
from areal_m2po.rollout.engines.hf_generator import HFGenerator

STOP = ["4", "7", "K", "q"]  # characters of no special token's text


def _rows(batch: dict[str, torch.Tensor]) -> list[list[int]]:
    return [
        [int(t) for t in ids[mask].tolist()]
        for ids, mask in zip(batch["input_ids"], batch["loss_mask"])
    ]


def test_fill_after_stop_string_is_not_a_generated_eos() -> None:
    model, tokenizer = tiny_model_and_tokenizer(0)
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # the case under test
    engine = HFGenerator(model, tokenizer, torch.device("cpu"))
    g = GenerationConfig(n_samples=64, max_new_tokens=10, temperature=1.0, stop=STOP)
    prompt = tokenizer("hello")["input_ids"]
    batch = engine.generate([prompt], g, seed=0)
    eos = tokenizer.eos_token_id
    by_stop = 0
    for r, out in enumerate(_rows(batch)):
        text = tokenizer.decode([t for t in out if t != eos])
        if any(s in text for s in STOP) and len(out) < g.max_new_tokens:
            by_stop += 1
            # ends at the token completing the stop string: no EOS after it, none trained on
            assert out[-1] != eos, f"row {r}: fill pad counted as a generated EOS: {out}"
            assert not any(s in tokenizer.decode(out[:-1]) for s in STOP)
            assert float(batch["behave_logp"][r].abs().sum()) > 0
            assert int(batch["loss_mask"][r].sum()) == len(out)
    assert by_stop >= 2, "the seed must give rows ended by a stop string before the limit"
    # rows ended by a sampled EOS keep it
    assert any(out and out[-1] == eos for out in _rows(batch))


def test_engine_response_after_stop_string_has_no_eos() -> None:
    model, tokenizer = tiny_model_and_tokenizer(0)
    engine = HFInProcessEngine(model, tokenizer, torch.device("cpu"))
    sampling = SamplingParams(max_new_tokens=10, stop=tuple(STOP))

    async def run() -> list:
        request = ModelRequest(tokenizer("hello")["input_ids"], sampling)
        return await asyncio.gather(
            *(engine.agenerate(ModelRequest(request.input_ids, sampling)) for _ in range(64))
        )

    torch.manual_seed(0)
    responses = asyncio.run(run())
    eos = tokenizer.eos_token_id
    stopped = [  # ended by a stop string before the limit
        r
        for r in responses
        if any(s in tokenizer.decode(r.output_ids) for s in STOP)
        and len(r.output_ids) < sampling.max_new_tokens
    ]
    assert len(stopped) >= 2
    for r in stopped:
        assert r.finish_reason == "stop"
        assert eos not in r.output_ids, r.output_ids
        assert len(r.output_logprobs) == len(r.output_ids)
