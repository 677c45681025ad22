"""AReaL's MultiTurnWorkflow (issue 56): answers until one is rewarded, the reward discounted
per retry, the episode one row of AReaL's tensor dict with the feedback turns out of the loss
mask; on a scripted engine (numbers by hand) and on builtin:tiny."""

from __future__ import annotations

import asyncio

import pytest
import torch
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.engine_api import ModelResponse as PkgResponse
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.areal.api.cli_args import GenerationHyperparameters
from areal_m2po.areal.api.engine_api import InferenceEngine
from areal_m2po.areal.trainer.episodes import ArealEpisodes
from areal_m2po.areal.workflow.multi_turn import FEEDBACK, MultiTurnWorkflow
from areal_m2po.rollout.executor import arun_group

MESSAGES = [{"role": "user", "content": "1+1?"}]


class Scripted(ScriptOnlyEngine):
    """Answers request k with the k-th (tokens, log-probs, versions) of its script."""

    def __init__(self, script: list[tuple[list[int], list[float], list[int]]]) -> None:
        self.script, self.requests = script, []

    async def agenerate(self, request):  # type: ignore[no-untyped-def]
        ids, logps, versions = self.script[len(self.requests)]
        self.requests.append(request)
        return PkgResponse(list(request.input_ids), ids, logps, versions, "stop")


def _rewards(*values: float):  # type: ignore[no-untyped-def]
    """A reward function of AReaL's signature returning ``values`` in turn; its calls kept."""
    calls = []

    def reward_fn(prompt, completions, prompt_ids, completion_ids, **data):  # type: ignore[no-untyped-def]
        calls.append((list(prompt_ids), list(completion_ids), sorted(data)))
        return values[len(calls) - 1]

    return reward_fn, calls


def _run(wf, engine, data=None):  # type: ignore[no-untyped-def]
    data = data or {"messages": MESSAGES, "answer": "2"}
    return asyncio.run(wf.arun_episode(InferenceEngine(engine), data))


def _workflow(tok, reward_fn, max_turns=3, discount=0.5):  # type: ignore[no-untyped-def]
    g = GenerationHyperparameters(n_samples=1, max_new_tokens=4)
    return MultiTurnWorkflow(reward_fn, g, tok, max_turns=max_turns, turn_discount=discount)


def test_a_wrong_then_right_answer_is_discounted_once_and_laid_out_as_arealss(tok):
    eos = tok.eos_token_id
    engine = Scripted([([5, 6], [-0.5, -0.25], [3, 3]), ([7, eos], [-1.0, -2.0], [4, 4])])
    reward_fn, calls = _rewards(0.0, 1.0)
    wf = _workflow(tok, reward_fn)
    out = _run(wf, engine)
    prompt = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    prompt = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
    fb = wf.multi_turn_prompt_ids
    assert FEEDBACK in tok.decode(fb)
    p, f = len(prompt), 1 + len(fb)  # the first answer had no EOS: one is added before feedback
    assert out["rewards"].tolist() == [0.5]  # 1.0 * 0.5 ** (2 - 1)
    assert out["input_ids"][0].tolist() == prompt + [5, 6, eos] + fb + [7, eos]
    assert out["loss_mask"][0].tolist() == [0] * p + [1, 1] + [0] * f + [1, 1]
    assert out["versions"][0].tolist() == [-1] * p + [3, 3] + [-1] * f + [4, 4]
    assert out["turn_ids"][0].tolist() == [-1] * p + [0, 0] + [-1] * f + [1, 1]
    assert out["logprobs"][0].tolist() == [0.0] * p + [-0.5, -0.25] + [0.0] * f + [-1.0, -2.0]
    assert out["attention_mask"].all() and out["input_ids"].shape == (1, p + 2 + f + 2)
    # the second request is the whole sequence so far; AReaL's reward call on each answer
    assert [list(r.input_ids) for r in engine.requests] == [prompt, prompt + [5, 6, eos] + fb]
    assert calls == [
        (prompt, [5, 6], ["answer", "messages"]),
        (prompt + [5, 6, eos] + fb, [7, eos], ["answer", "messages"]),
    ]
    assert list(engine.requests[0].sampling.stop_token_ids) == [eos]


def test_all_wrong_answers_stop_at_max_turns_with_no_eos_added_after_eos(tok):
    eos = tok.eos_token_id
    engine = Scripted([([5, eos], [-0.5, -0.5], [1, 1])] * 2)
    reward_fn, calls = _rewards(0.0, 0.0)
    wf = _workflow(tok, reward_fn, max_turns=2, discount=0.9)
    out = _run(wf, engine)
    fb = wf.multi_turn_prompt_ids
    assert len(engine.requests) == 2 and len(calls) == 2
    assert out["rewards"].tolist() == [0.0]
    assert list(engine.requests[1].input_ids)[-len(fb) - 2 :] == [5, eos, *fb]


def test_a_negative_reward_ends_the_episode_as_arealss_loop_does(tok):
    """AReaL retries while the reward is 0: a negative reward is final, undiscounted."""
    engine = Scripted([([5, 6], [-0.5, -0.5], [0, 0])] * 3)
    reward_fn, _ = _rewards(-1.0)
    out = _run(_workflow(tok, reward_fn), engine)
    assert len(engine.requests) == 1
    assert out["rewards"].tolist() == [-1.0]
    assert out["turn_ids"][0].tolist()[-2:] == [0, 0]


def test_three_turns_are_discounted_twice(tok):
    engine = Scripted([([5], [-0.5], [0])] * 3)
    reward_fn, _ = _rewards(0.0, 0.0, 2.0)
    out = _run(_workflow(tok, reward_fn, max_turns=3, discount=0.5), engine)
    assert out["rewards"].tolist() == [0.5]  # 2.0 * 0.5 * 0.5
    assert out["turn_ids"][0].tolist().count(2) == 1


@pytest.mark.parametrize(("turns", "discount"), [(0, 0.5), (2, 0.0), (2, 1.5)])
def test_out_of_range_settings_are_refused(tok, turns, discount):
    with pytest.raises(ValueError, match="max_turns|turn_discount"):
        _workflow(tok, lambda *a, **k: 0.0, max_turns=turns, discount=discount)


def test_its_episodes_become_trajectories_with_their_versions(tok):
    """Through this package's rollout: the group of n episodes, the feedback out of the loss."""
    eos = tok.eos_token_id
    engine = Scripted([([5, 6], [-0.5, -0.25], [3, 3]), ([7, eos], [-1.0, -2.0], [4, 4])] * 2)
    reward_fn, _ = _rewards(0.0, 1.0, 0.0, 1.0)
    g = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
    context = WorkflowContext(tok, g, SamplingParams(4), [eos], reward=None)
    wf = ArealEpisodes(context, _workflow(tok, reward_fn))
    record = {"messages": MESSAGES, "answer": "2"}
    group = asyncio.run(arun_group(wf, engine, record, 2))
    assert group is not None and group.rewards == [0.5, 0.5]
    t = group.trajectories[0]
    fb = _workflow(tok, reward_fn).multi_turn_prompt_ids
    p = t.prompt_len
    assert [v for v in t.versions[p:]] == [3, 3] + [-1] * (1 + len(fb)) + [4, 4]
    assert sum(t.loss_mask) == 4 and not t.no_eos


def test_on_the_tiny_model_the_row_is_what_the_engine_saw(tok):
    from transformers import AutoModelForCausalLM

    from areal_m2po.engine.builtin_models import resolve_model_path
    from areal_m2po.rollout.engines.hf import HFInProcessEngine

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("builtin:tiny")).eval()
    engine = HFInProcessEngine(model, tok, torch.device("cpu"))
    seen = []
    real = engine.agenerate

    async def recording(request):  # type: ignore[no-untyped-def]
        out = await real(request)
        seen.append(out)
        return out

    engine.agenerate = recording  # type: ignore[method-assign]
    reward_fn, calls = _rewards(0.0, 0.0)
    out = _run(_workflow(tok, reward_fn, max_turns=2), engine)
    assert len(seen) == 2 and out["rewards"].tolist() == [0.0]
    last = seen[-1]
    assert out["input_ids"][0].tolist() == list(last.input_ids) + list(last.output_ids)
    mask = out["loss_mask"][0].tolist()
    assert sum(mask) == len(seen[0].output_ids) + len(last.output_ids)
    logps = [x for x, m in zip(out["logprobs"][0].tolist(), mask) if m]
    expected = [*seen[0].output_logprobs, *last.output_logprobs]
    assert logps == pytest.approx(expected) and all(x <= 0 for x in logps)
    assert set(out["versions"][0].tolist()) <= {-1, engine.get_version()}
    assert calls[1][1] == list(last.output_ids)


def test_an_episode_with_no_room_for_the_feedback_ends_with_reward_zero(tok):
    """The trainer's episode budget (not AReaL's): the feedback turn does not fit after the
    first wrong answer, so the episode ends there; the answer asks only for what is left."""
    from areal_m2po.areal.infra import workflow_context

    engine = Scripted([([5, 6], [-0.5, -0.5], [0, 0]), ([7], [-0.5], [0])])
    reward_fn, calls = _rewards(0.0, 1.0)
    wf = _workflow(tok, reward_fn)
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)
    prompt_len = len(ids["input_ids"] if hasattr(ids, "keys") else ids)
    budget = prompt_len + 3  # room for 3 tokens: the answer, not the feedback after it

    async def go():  # type: ignore[no-untyped-def]
        workflow_context.set(workflow_context.WorkflowContext(max_episode_tokens=budget))
        return await wf.arun_episode(InferenceEngine(engine), {"messages": MESSAGES})

    out = asyncio.run(go())
    assert len(engine.requests) == 1 and len(calls) == 1
    assert engine.requests[0].sampling.max_new_tokens == 3  # min(max_new_tokens 4, 3 left)
    assert out["rewards"].tolist() == [0.0] and out["input_ids"].shape[1] == prompt_len + 2
