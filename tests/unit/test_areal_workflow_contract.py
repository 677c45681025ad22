"""AReaL's workflow contract on this package's rollout (issue 56): an AReaL workflow's tensor
dict becomes trajectories with its per-token versions and log-probs, a record's group has
gconfig.n_samples of them whichever way the workflow groups, and RLVRWorkflow calls the reward
with AReaL's record (a record's prompt_ids here does not collide)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.engine_api import ModelResponse as PkgResponse
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.api.errors import WorkflowError
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.areal.api import ModelRequest, RolloutWorkflow
from areal_m2po.areal.api.cli_args import GenerationHyperparameters
from areal_m2po.areal.trainer.episodes import ArealEpisodes
from areal_m2po.areal.trainer.rl_trainer import to_records
from areal_m2po.areal.workflow.rlvr import RLVRWorkflow
from areal_m2po.rollout.executor import arun_group

OUT = [5, 6, 2]  # token 2 is the tiny tokenizer's EOS
LOGP = [-0.5, -0.25, -0.125]
VERS = [3, 3, 4]


class CountingEngine(ScriptOnlyEngine):
    """Answers every request with OUT, LOGP and VERS; records the requests."""

    def __init__(self) -> None:
        self.requests = []

    async def agenerate(self, request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)  # yields, as a real engine does: the group's episodes interleave
        self.requests.append(request)
        n = len(self.requests)
        out = [OUT[0] + n, *OUT[1:]]  # each completion its own first token
        return PkgResponse(list(request.input_ids), out, list(LOGP), list(VERS), "stop")


def _context(n: int, tok) -> WorkflowContext:  # type: ignore[no-untyped-def]
    g = GenerationHyperparameters(n_samples=n, max_new_tokens=4)
    return WorkflowContext(tok, g, SamplingParams(4), [2], reward=None)


def _row(resp, reward: float) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    p, c = resp.input_len, resp.output_len
    return {
        "input_ids": torch.tensor([resp.input_tokens + resp.output_tokens]),
        "loss_mask": torch.tensor([[0] * p + [1] * c]),
        "logprobs": torch.tensor([[0.0] * p + resp.output_logprobs]),
        "versions": torch.tensor([[-1] * p + resp.output_versions]),
        "attention_mask": torch.ones(1, p + c, dtype=torch.bool),
        "rewards": torch.tensor([reward]),
    }


class OneSample(RolloutWorkflow):
    """cbff54d6's kind: one completion per episode."""

    def __init__(self, gconfig) -> None:  # type: ignore[no-untyped-def]
        self.gconfig = gconfig

    async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
        req = ModelRequest(input_ids=[7, 8, 9], gconfig=self.gconfig.new(n_samples=1))
        return _row(await engine.agenerate(req), 0.5)


class WholeGroup(OneSample):
    """The older kind: the record's n_samples completions in one episode, stacked and right-
    padded by two columns (attention_mask 0), as AReaL's concat_padded_tensors pads."""

    async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
        req = ModelRequest(input_ids=[7, 8, 9], gconfig=self.gconfig.new(n_samples=1))
        rows = [_row(await engine.agenerate(req), float(i)) for i in range(self.gconfig.n_samples)]
        out = {k: torch.cat([r[k] for r in rows]) for k in rows[0]}
        for k in ("input_ids", "loss_mask", "logprobs", "versions", "attention_mask"):
            out[k] = torch.nn.functional.pad(out[k], (0, 2))
        return out


def _group(workflow, tok, n, records):  # type: ignore[no-untyped-def]
    engine = CountingEngine()
    wrapped = ArealEpisodes(_context(n, tok), workflow)

    async def go():  # type: ignore[no-untyped-def]
        return [await arun_group(wrapped, engine, r, n) for r in records]

    return asyncio.run(go()), engine


def test_one_sample_episodes_keep_versions_and_logprobs(tok):
    groups, engine = _group(OneSample(GenerationHyperparameters(n_samples=3)), tok, 3, [{"a": 1}])
    assert len(engine.requests) == 3
    (group,) = groups
    assert len(group) == 3
    t = group.trajectories[0]
    assert t.prompt_len == 3
    assert t.versions == [-1, -1, -1, *VERS]
    assert t.logprobs == [0.0, 0.0, 0.0, *LOGP]
    assert t.loss_mask == [False] * 3 + [True] * 3
    assert t.reward == 0.5 and not t.no_eos
    # every episode its own completion
    assert len({tuple(t.input_ids) for t in group.trajectories}) == 3


def test_a_whole_group_episode_gives_n_samples_not_n_squared(tok):
    n = 3
    groups, engine = _group(
        WholeGroup(GenerationHyperparameters(n_samples=n)), tok, n, [{"a": 1}, {"b": 2}]
    )
    # n completions per record, not n x n
    assert len(engine.requests) == 2 * n
    for group in groups:
        assert len(group) == n
        assert group.rewards == [0.0, 1.0, 2.0]
        # the right padding (attention_mask 0) is not part of any trajectory
        assert all(len(t.input_ids) == 6 for t in group.trajectories)
        assert group.trajectories[1].versions == [-1, -1, -1, *VERS]


def test_a_row_count_neither_one_nor_n_is_refused(tok):
    with pytest.raises(WorkflowError, match="returned 2 rows; expected 1"):
        _group(WholeGroup(GenerationHyperparameters(n_samples=2)), tok, 3, [{"a": 1}])


def test_engine_refuses_n_samples_above_one(tok):
    from areal_m2po.areal.api.engine_api import InferenceEngine

    req = ModelRequest(input_ids=[1, 2], gconfig=GenerationHyperparameters(n_samples=4))
    with pytest.raises(ValueError, match="n_samples=4: an engine call makes one"):
        asyncio.run(InferenceEngine(CountingEngine()).agenerate(req))


def test_generation_hyperparameters_copies(tok):
    g = GenerationHyperparameters(n_samples=4, max_new_tokens=9, temperature=0.7)
    h = g.new_with_stop_and_pad_token_ids(tok)
    assert h.stop_token_ids == [tok.pad_token_id] and g.stop_token_ids is None  # pad == eos here
    s = h.new(n_samples=1).to_sampling()
    assert (s.max_new_tokens, s.temperature, s.stop_token_ids) == (9, 0.7, (tok.pad_token_id,))


def test_rlvr_reward_gets_areal_record_not_this_packages(tok):
    """The record here carries prompt_ids (this trainer's); AReaL's reward call passes its own
    prompt_ids positionally and the record as **data: the record it gets is AReaL's."""
    calls = []

    def reward_fn(prompt, completions, prompt_ids, completion_ids, **data):  # type: ignore[no-untyped-def]
        calls.append((prompt_ids, completion_ids, sorted(data)))
        return 1.0

    g = GenerationHyperparameters(n_samples=2, max_new_tokens=4)
    (record,) = to_records([{"messages": [{"role": "user", "content": "1+1"}], "answer": "2"}], tok)
    assert "prompt_ids" in record
    wf = RLVRWorkflow(reward_fn=reward_fn, gconfig=g, tokenizer=tok)
    groups, engine = _group(wf, tok, 2, [record])
    assert len(groups[0]) == 2 and groups[0].rewards == [1.0, 1.0]
    prompt = record["prompt_ids"]
    assert [c[0] for c in calls] == [prompt, prompt]
    assert calls[0][2] == ["answer", "messages"]
    assert list(engine.requests[0].sampling.stop_token_ids) == [tok.eos_token_id]


def test_dynamic_filter_fn_sees_the_group_as_arealss_dict(tok):
    seen = []

    def keep(group):  # type: ignore[no-untyped-def]
        seen.append({k: tuple(v.shape) for k, v in group.items()})
        return bool(group["rewards"].std() > 0)  # AReaL's usual filter: drop uniform groups

    engine = CountingEngine()
    wf = ArealEpisodes(
        _context(2, tok), OneSample(GenerationHyperparameters(n_samples=2)), None, keep
    )
    group = asyncio.run(arun_group(wf, engine, {"a": 1}, 2))
    assert group is None  # both rewards 0.5
    assert seen == [
        {
            "input_ids": (2, 6),
            "loss_mask": (2, 6),
            "logprobs": (2, 6),
            "versions": (2, 6),
            "attention_mask": (2, 6),
            "rewards": (2,),
        }
    ]


def test_evaluation_runs_the_eval_workflow_once_per_record(tok):
    class Scored(OneSample):
        async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
            row = await super().arun_episode(engine, data)
            row["rewards"] = torch.tensor([data["score"]])
            return row

    g = GenerationHyperparameters(n_samples=3)
    wf = ArealEpisodes(_context(3, tok), OneSample(g), Scored(g))
    engine = CountingEngine()
    results = [asyncio.run(wf.aevaluate(engine, {"score": s})) for s in (1.0, 0.25)]
    assert results == [{"correct": 1.0, "reward": 1.0}, {"correct": 0.0, "reward": 0.25}]
    assert len(engine.requests) == 2
    assert asyncio.run(ArealEpisodes(_context(3, tok), OneSample(g)).aevaluate(engine, {})) is None


def test_one_record_object_in_two_groups_gets_two_groups(tok):
    """The same record object twice in a batch (a loader repeating a row): two groups of n."""
    n = 2
    engine = CountingEngine()
    wf = ArealEpisodes(_context(n, tok), WholeGroup(GenerationHyperparameters(n_samples=n)))
    record = {"a": 1}

    async def go():  # type: ignore[no-untyped-def]
        await arun_group(wf, engine, {"first": 0}, n)  # learns: n rows per episode
        return await asyncio.gather(*(arun_group(wf, engine, record, n) for _ in range(2)))

    groups = asyncio.run(go())
    assert [len(g) for g in groups] == [n, n]
    assert len(engine.requests) == 3 * n


def test_a_changing_row_count_fails_every_episode_of_the_group(tok):
    class Changing(WholeGroup):
        async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
            out = await super().arun_episode(engine, data)
            return out if data.get("first") else {k: v[:1] for k, v in out.items()}

    wf = ArealEpisodes(_context(2, tok), Changing(GenerationHyperparameters(n_samples=2)))

    async def go():  # type: ignore[no-untyped-def]
        await arun_group(wf, CountingEngine(), {"first": 1}, 2)
        await asyncio.wait_for(arun_group(wf, CountingEngine(), {"b": 2}, 2), 30)

    with pytest.raises(WorkflowError, match="returned 1 rows; expected 2 as before"):
        asyncio.run(go())
