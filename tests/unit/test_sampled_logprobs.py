"""Behaviour log-probs taken step by step during generation (engine/sampled_logprobs.py).

The reference is independent of generation: one forward pass of the same weights over the
returned sequences, ``log softmax(logits / T)`` of each next token.
"""

from __future__ import annotations

import pytest
import torch

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.rollout.engines.hf_generator import HFGenerator
from areal_m2po.rollout.engines.sampled_logprobs import SampledLogprobRecorder

QUESTIONS = ["What is 12 + 34?", "Hi", "What is 99 + 10? Reply with only the number."]


@pytest.fixture(scope="module")
def tiny() -> tuple[HFGenerator, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.engine.builtin_models import resolve_model_path

    path = resolve_model_path("builtin:tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return HFGenerator(model, tok, torch.device("cpu")), tok


def _prompts(tok, questions=QUESTIONS) -> list[list[int]]:
    return [
        tok(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            )
        )["input_ids"]
        for q in questions
    ]


def _reference_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T-1, V]``: the logits predicting tokens 1..T-1, one forward pass, no cache."""
    mask = batch["attention_mask"].long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=mask, position_ids=position_ids)
    return out.logits[:, :-1].float()


CASES = {
    "greedy": (GenerationConfig(n_samples=1, max_new_tokens=12), True),
    "T=1": (GenerationConfig(n_samples=4, max_new_tokens=12, temperature=1.0), False),
    "T=0.7": (GenerationConfig(n_samples=4, max_new_tokens=12, temperature=0.7), False),
    "T=0.7, stop strings": (
        GenerationConfig(n_samples=4, max_new_tokens=12, temperature=0.7, stop=["a", "e", "4"]),
        False,
    ),
    # min_new_tokens masks EOS in the first steps; the log-probs stay those of the raw logits
    "T=1.3, min_new_tokens": (
        GenerationConfig(n_samples=3, max_new_tokens=12, temperature=1.3, min_new_tokens=5),
        False,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_behaviour_logprobs_equal_a_forward_pass(tiny, case: str) -> None:
    engine, tok = tiny
    gconfig, greedy = CASES[case]
    batch = engine.generate(_prompts(tok), gconfig, greedy=greedy, seed=7)
    mask = batch["loss_mask"][:, 1:]
    assert mask.any()
    logits = _reference_logits(engine.model, batch)
    targets = batch["input_ids"][:, 1:]
    got = batch["behave_logp"][:, 1:]
    assert (batch["behave_logp"][~batch["loss_mask"]] == 0).all()
    if greedy:
        assert (got == 0).all()
        assert torch.equal(logits.argmax(-1)[mask], targets[mask])
        return
    ref = torch.log_softmax(logits / gconfig.temperature, -1)
    ref = ref.gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(got[mask], ref[mask], atol=2e-5, rtol=0)
    if gconfig.stop:
        texts = engine.decode_completions(batch)
        ended = [t for t in texts if any(t.endswith(s) for s in gconfig.stop)]
        assert ended, texts  # some rows were cut by a stop string
        for t in texts:  # and nothing follows the first stop string
            first = min((t.find(s) for s in gconfig.stop if s in t), default=-1)
            assert first in (-1, len(t) - 1), t


def test_generation_keeps_one_step_of_logits() -> None:
    """The allocation peak of a sampled ``generate`` stays far below the logits of all steps
    (``B x C x V`` fp32), which ``output_logits=True`` held until it returned. One step's
    working set is about 8 ``B x V`` tensors (HF's own copies, softmax, sampling), so the
    call runs 64 steps."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer

    vocab, rows, steps = 20000, 16, 64
    model = build_tiny_llama(vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1)
    engine = HFGenerator(model, build_tiny_tokenizer(), torch.device("cpu"))
    engine.eos_ids, engine.pad_id = [vocab - 1], vocab - 1  # a token the random model rarely picks
    g = GenerationConfig(n_samples=rows // 4, max_new_tokens=steps, min_new_tokens=steps)
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13], [14, 15, 16, 17, 18]]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        batch = engine.generate(prompts, g, seed=0)
    assert batch["loss_mask"].sum(-1).eq(steps).all()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.tag == _EventType.Allocation:
            events.append((node.start_time_ns, int(node.extra_fields.alloc_size)))
    cur = peak = 0
    for _, size in sorted(events):
        cur += size
        peak = max(peak, cur)
    all_logits = rows * steps * vocab * 4
    assert peak < all_logits / 4, (peak, all_logits)


def test_recorder_refuses_a_generate_it_is_not_attached_to() -> None:
    rec = SampledLogprobRecorder(1.0)
    with pytest.raises(RuntimeError, match="attached"):
        rec(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="temperature"):
        SampledLogprobRecorder(0.0)
