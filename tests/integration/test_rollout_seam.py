"""The rollout seam (rollout/): engines, workflows and executors, and the bugs it fixed.

* the in-process engine batches the requests of a batch into the one ``generate`` call the
  trainer made before (same tokens, same log-probs);
* the same workflow and reward sources give the same scores in sync and async mode, checked
  against a direct reference (the reward function and the reward model's own HF forward);
* a workflow returning None drops its group in both modes;
* dataset columns reach the reward function; the learned reward is applied in async mode;
* a fake engine written here drives a full training step: the interface is all the trainer
  needs.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import runpy
from pathlib import Path

import pytest
import torch
from scripted_engine import ScriptedEngine, ScriptOnlyEngine
from toy_rewards import digit_fraction

from areal_m2po.api.cli_args import ConfigError, DatasetConfig, GenerationConfig, RewardModelConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.api.errors import WorkflowError
from areal_m2po.api.workflow_api import TrajectoryGroup, WorkflowContext
from areal_m2po.reward.runner import RewardRunner
from areal_m2po.rollout.async_executor import AsyncRolloutExecutor
from areal_m2po.rollout.batch_builder import groups_to_batch
from areal_m2po.rollout.engines.hf import HFInProcessEngine, plan_calls
from areal_m2po.rollout.engines.remote.errors import RolloutServerError, ServerError
from areal_m2po.rollout.executor import RolloutSetup, arun_group
from areal_m2po.rollout.rewards import RewardSources
from areal_m2po.rollout.staleness import StalenessBudget
from areal_m2po.rollout.sync_executor import SyncRolloutExecutor
from areal_m2po.rollout.workflows import build_workflow
from areal_m2po.rollout.workflows.rlvr import RLVRWorkflow

REPO = Path(__file__).resolve().parents[2]

N, B = 4, 4
GCONFIG = GenerationConfig(n_samples=N, max_new_tokens=8)


@pytest.fixture(scope="module")
def tiny():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from areal_m2po.dataset import load_prompt_dataset
    from areal_m2po.engine.builtin_models import resolve_model_path

    path = resolve_model_path("builtin:tiny")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    records = load_prompt_dataset(
        DatasetConfig(batch_size=B, max_prompt_length=128), tok, seed=1, name="train"
    )[:B]
    return model, tok, records


class _Loader:
    """The same records every call (epoch 0), as the trainer's loader hands them out."""

    def __init__(self, records):
        self.records = records

    def next_batch(self):
        return [dict(r) for r in self.records], 0


def _context(tok, eos, reward, gconfig=GCONFIG) -> WorkflowContext:
    return WorkflowContext(tok, gconfig, SamplingParams.from_gconfig(gconfig), eos, reward)


def _sync(engine, workflow, ctx, records, seed=3):
    return SyncRolloutExecutor(
        RolloutSetup(engine, workflow, ctx, engine.pad_id), _Loader(records), 0, seed
    )


def _async(engine, workflow, ctx, records):
    budget = StalenessBudget(len(records), N, 0, len(records) * N)
    setup = RolloutSetup(engine, workflow, ctx, engine.pad_id)
    ex = AsyncRolloutExecutor(setup, budget, _Loader(records).next_batch)
    ex.start(lambda: iter(engine.generator.model.state_dict().items()), 0)
    return ex


def _verifiable(fn=digit_fraction) -> RewardSources:
    return RewardSources(RewardRunner(fn, timeout_s=30, max_workers=2))


# ---------------------------------------------------------------------------------------------
# the in-process engine
# ---------------------------------------------------------------------------------------------


def test_plan_calls_by_hand():
    assert plan_calls([[1], [1], [2], [2], [1], [1]]) == ([[1], [2], [1]], 2)
    assert plan_calls([[1]] * 4 + [[2]] * 8) == ([[1], [2], [2]], 4)
    assert plan_calls([[1], [1], [1], [2]]) == ([[1], [1], [1], [2]], 1)
    assert plan_calls([[5, 6]]) == ([[5, 6]], 1)


def test_a_batch_of_episodes_is_one_generate_call_with_the_old_tokens(tiny):
    """B RLVR episodes of n requests each are sampled in one shared-prefill call: the batch
    equals what ``HFGenerator.generate`` (the trainer's call before workflows) returns."""
    model, tok, records = tiny
    engine = HFInProcessEngine(model, tok, torch.device("cpu"))
    direct = engine.generator.generate([r["prompt_ids"] for r in records], GCONFIG, seed=11)
    calls = []
    real = engine.generator.generate

    def counting(prompts, *args, **kwargs):
        calls.append(len(prompts))
        return real(prompts, *args, **kwargs)

    engine.generator.generate = counting
    workflow = RLVRWorkflow(_context(tok, engine.eos_ids, _verifiable()))

    async def batch():
        return await asyncio.gather(*(arun_group(workflow, engine, dict(r), N) for r in records))

    torch.manual_seed(11)
    groups = asyncio.run(batch())
    assert calls == [B]  # one call, B prompts (n samples each from one prefill)
    built = groups_to_batch(groups, engine.pad_id)
    for key in ("input_ids", "attention_mask", "loss_mask", "behave_logp", "versions", "no_eos"):
        assert torch.equal(built[key], direct[key]), key
    texts = engine.generator.decode_completions(direct)
    assert built["rewards"].tolist() == pytest.approx([digit_fraction("", t, "") for t in texts])


def test_hf_engine_versions_weights_from_disk_and_greedy(tiny, tmp_path):
    from areal_m2po.rollout.common.weight_files import write_weights

    model, tok, records = tiny
    engine = HFInProcessEngine(model, tok, torch.device("cpu"))
    prompt = records[0]["prompt_ids"]
    greedy = SamplingParams(max_new_tokens=5, temperature=0.0)

    async def two():
        return await asyncio.gather(*(engine.agenerate(ModelRequest(prompt, greedy)) for _ in "ab"))

    a, b = asyncio.run(two())
    assert a.output_ids == b.output_ids and a.output_logprobs == [0.0] * a.output_len
    assert a.finish_reason == ("stop" if a.output_ids[-1] in engine.eos_ids else "length")
    assert a.output_versions == [0] * a.output_len and a.input_ids == prompt
    # new weights from disk, stamped: later tokens carry the version
    path = write_weights(model.state_dict(), str(tmp_path / "w"), 7, model.config)
    engine.update_weights_from_disk(path, 7)
    assert engine.get_version() == 7
    c = asyncio.run(asyncio.wait_for(engine.agenerate(ModelRequest(prompt, greedy)), 60))
    assert c.output_versions == [7] * c.output_len and c.output_ids == a.output_ids
    with pytest.raises(ValueError, match="stamped"):
        engine.update_weights_from_disk(path, 8)
    engine.pause()
    engine.resume()
    engine.set_version(9)
    assert engine.get_version() == 9


# ---------------------------------------------------------------------------------------------
# one workflow, two modes
# ---------------------------------------------------------------------------------------------


def _rm_reference(learned, question: str, completion: str) -> float:
    """The reward model's score by its own HF forward (no areal_m2po pooling)."""
    from areal_m2po.dataset.preference import reward_model_text

    text, special = reward_model_text(learned.tokenizer, question, completion)
    enc = learned.tokenizer(text, add_special_tokens=special, return_tensors="pt")
    with torch.no_grad():
        return float(learned.model(**enc).logits[0, 0])


def test_custom_workflow_and_reward_sources_score_alike_in_sync_and_async_mode(tiny):
    """The example workflow (format bonus) over a verifiable reward and a learned reward model,
    both weighted: every trained reward equals ``score + 0.5 * digit_fraction + bonus`` of its
    own completion, in both modes, and both log the learned reward's statistics."""
    from areal_m2po.reward.reward_model import LearnedReward

    model, tok, records = tiny
    torch.manual_seed(0)  # the fresh score head on builtin:tiny
    learned = LearnedReward(
        RewardModelConfig(path="builtin:tiny", weight=1.0, verifiable_weight=0.5), "cpu"
    )
    example = runpy.run_path(str(REPO / "examples" / "custom_workflow.py"))
    reward = RewardSources(RewardRunner(digit_fraction, 30, 2), learned)
    results = {}
    for mode in ("sync", "async"):
        engine = HFInProcessEngine(model, tok, torch.device("cpu"))
        ctx = _context(tok, engine.eos_ids, reward)
        workflow = example["FormatBonusWorkflow"](ctx, format_bonus=0.25)
        ex = (_sync if mode == "sync" else _async)(engine, workflow, ctx, records)
        try:
            batch, info = ex.next_batch()
        finally:
            ex.close()
        texts = engine.generator.decode_completions(batch)
        questions = [r["question"] for r in records for _ in range(N)]
        expected = [
            _rm_reference(learned, q, t) + 0.5 * digit_fraction("", t, "")
            + (0.25 if any(c.isdigit() for c in t) else 0.0)
            for q, t in zip(questions, texts)
        ]  # fmt: skip
        assert batch["rewards"].tolist() == pytest.approx(expected, abs=1e-5), mode
        hits = sum(any(c.isdigit() for c in t) for t in texts)
        assert info["workflow/format_hits"] == hits
        raw = [_rm_reference(learned, q, t) for q, t in zip(questions, texts)]
        assert info["reward/model_score"] == pytest.approx(sum(raw) / len(raw), abs=1e-5)
        results[mode] = set(info)
    assert results["sync"] == results["async"]


class _DropFlagged(RLVRWorkflow):
    async def arun_episode(self, engine, record):
        return None if record.get("drop") else await super().arun_episode(engine, record)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_workflow_returning_none_drops_its_group(tiny, mode):
    model, tok, records = tiny
    flagged = [dict(r, drop=i in (1, 2)) for i, r in enumerate(records)]
    engine = HFInProcessEngine(model, tok, torch.device("cpu"))
    ctx = _context(tok, engine.eos_ids, _verifiable())
    ex = (_sync if mode == "sync" else _async)(engine, _DropFlagged(ctx), ctx, flagged)
    try:
        batch, info = ex.next_batch()
    finally:
        ex.close()
    assert batch["input_ids"].shape[0] == 2 * N and batch["rewards"].shape == (2 * N,)
    assert info["rollout/n_dropped_groups"] == 2
    # the kept rows are the groups of records 0 and 3, in order
    for row, rec in zip(range(0, 2 * N, N), (records[0], records[3])):
        ids = batch["input_ids"][row][batch["attention_mask"][row] & ~batch["loss_mask"][row]]
        assert ids.tolist() == rec["prompt_ids"]


def test_every_group_dropped_is_one_clear_error(tiny):
    model, tok, records = tiny
    engine = HFInProcessEngine(model, tok, torch.device("cpu"))
    ctx = _context(tok, engine.eos_ids, _verifiable())
    ex = _sync(engine, _DropFlagged(ctx), ctx, [dict(r, drop=True) for r in records])
    with pytest.raises(RuntimeError, match=r"rollout.workflow rlvr: every group of a batch"):
        ex.next_batch()


def test_workflow_config_errors_name_the_key(tiny):
    _, tok, _ = tiny
    ctx = _context(tok, [0], _verifiable())
    with pytest.raises(ConfigError, match=r"rollout.workflow.*no attribute"):
        build_workflow("areal_m2po.rollout.workflows.rlvr:Nope", None, ctx)
    with pytest.raises(ConfigError, match=r"rollout.workflow_kwargs.*colour"):
        build_workflow("rlvr", {"colour": "red"}, ctx)
    with pytest.raises(ConfigError, match=r"rollout.workflow.*not an.*RolloutWorkflow"):
        build_workflow("toy_rewards:digit_fraction", {"completion": "", "answer": ""}, ctx)
    with pytest.raises(ConfigError, match="rollout.workflow"):
        load_config(["rollout.workflow=nodots"])
    with pytest.raises(ConfigError, match="rollout.workflow_kwargs"):
        load_config(["rollout.workflow_kwargs=[1, 2]"])
    # the executor owns the group's fan-out: no workflow takes a sample count
    with pytest.raises(ConfigError, match=r"rollout.workflow_kwargs.*n_samples"):
        build_workflow("rlvr", {"n_samples": 2}, ctx)


class _Shrinking(RLVRWorkflow):
    async def afinish_group(self, record, trajectories):
        return await super().afinish_group(record, trajectories[:3])


class _NotATrajectory(RLVRWorkflow):
    async def arun_episode(self, engine, record):
        return TrajectoryGroup([await super().arun_episode(engine, record)])


def test_a_group_of_the_wrong_size_or_an_episode_of_the_wrong_type_is_refused(tiny):
    model, tok, records = tiny
    engine = HFInProcessEngine(model, tok, torch.device("cpu"))
    ctx = _context(tok, engine.eos_ids, _verifiable())
    ex = _sync(engine, _Shrinking(ctx), ctx, records)
    with pytest.raises(ValueError, match=r"rollout.workflow rlvr: a group holds 3 .* is 4"):
        ex.next_batch()
    ex = _sync(engine, _NotATrajectory(ctx), ctx, records)
    with pytest.raises(WorkflowError, match=r"rollout.workflow rlvr: arun_episode returned "
                       "TrajectoryGroup, not a Trajectory or None"):  # fmt: skip
        ex.next_batch()


# ---------------------------------------------------------------------------------------------
# dataset columns reach the reward function
# ---------------------------------------------------------------------------------------------


def test_reward_fn_gets_the_columns_it_names_or_all_with_kwargs():
    seen = []

    def named(prompt, completion, answer, bonus):
        return float(bonus)

    def anything(prompt, completion, answer, **kw):
        seen.append(kw)
        return 1.0

    extras = [{"bonus": 0.5, "question": "q", "source": "x"}]
    with RewardRunner(named, 10, 1) as runner:
        assert runner.score(["p"], ["c"], ["a"], extras) == (
            [0.5],
            {"reward/n_errors": 0.0, "reward/n_timeouts": 0.0, "reward/n_invalid": 0.0},
        )
    with RewardRunner(anything, 10, 1) as runner:
        runner.score(["p"], ["c"], ["a"], extras)
    assert seen == extras


def _tiny_run(tmp_path, *overrides):
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = load_config(
        [
            "--config",
            str(REPO / "configs" / "tiny.yaml"),
            f"output_dir={tmp_path / 'run'}",
            "total_train_steps=1",
            "rollout.staleness=0",
            "evaluator.eval_at_end=false",
            "saver.save_at_end=false",
            *overrides,
        ]
    )
    trainer = RLTrainer(cfg)
    try:
        trainer.train()
    finally:
        trainer.close()
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def test_dataset_columns_reach_the_reward_function(tmp_path):
    """A jsonl dataset with a ``bonus`` column and a reward function that returns it: the
    trained rewards are the column's values (before the fix the function never got it)."""
    data = tmp_path / "data.jsonl"
    with open(data, "w", encoding="utf-8") as fh:
        for i in range(8):
            fh.write(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1),
                                 "bonus": 0.25}) + "\n")  # fmt: skip
    rows = _tiny_run(
        tmp_path,
        f"train_dataset.path={data}",
        f"valid_dataset.path={data}",
        "reward.path=toy_rewards:column_value",
    )
    assert rows[0]["reward/n_errors"] == 0
    assert rows[0]["reward/mean"] == pytest.approx(0.25)


# ---------------------------------------------------------------------------------------------
# the learned reward in async mode
# ---------------------------------------------------------------------------------------------


def test_async_mode_applies_the_learned_reward(tmp_path):
    """rollout.mode=async with reward.model: the trained reward is the reward model's score
    (weight 1, verifiable weight 0, no norm), and its statistics are logged. Before the fix the
    async path trained on the verifiable reward alone."""
    rows = _tiny_run(
        tmp_path,
        "rollout.mode=async",
        "rollout.server_threads=1",
        "reward.path=toy_rewards:digit_fraction",
        "reward.model.path=builtin:tiny",
        "evaluator.eval_at_end=true",
    )
    (row,) = rows
    assert "reward/model_score" in row and "reward/verifiable" in row
    assert row["reward/mean"] == pytest.approx(row["reward/model_score"], abs=1e-5)
    assert row["reward/mean"] != pytest.approx(row["reward/verifiable"], abs=1e-5)
    assert row["rollout/n_servers"] == 1
    assert 0.0 <= row["eval/accuracy"] <= 1.0 and row["eval/n"] > 0  # greedy on the server


# ---------------------------------------------------------------------------------------------
# the interface is all the trainer needs
# ---------------------------------------------------------------------------------------------


def test_a_fake_engine_drives_a_full_training_step(tmp_path):
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = load_config(
        [
            "--config",
            str(REPO / "configs" / "tiny.yaml"),
            f"output_dir={tmp_path / 'run'}",
            *("total_train_steps=1", "rollout.staleness=0", "saver.save_at_end=false"),
            *("evaluator.eval_at_end=false", "reward.path=toy_rewards:digit_fraction"),
        ]
    )
    trainer = RLTrainer(cfg)
    tok = trainer.tokenizer
    digits = [tok.convert_tokens_to_ids(d) for d in "123"]
    fake = ScriptedEngine(digits, int(tok.eos_token_id))
    trainer.rollout.engine = fake
    try:
        trainer.train()
        names = list(trainer.actor_engine.unwrapped.state_dict())
    finally:
        trainer.close()
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as fh:
        (row,) = [json.loads(line) for line in fh if line.strip()]
    assert fake.requests == 16 and fake.version == 1 and fake.loaded == names
    # completions of 0..3 digits (each 1/4 of the 16), digit_fraction = 1 on non-empty text
    assert row["rollout/gen_len_mean"] == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert row["reward/mean"] == pytest.approx(0.75)
    assert row["rollout/no_eos_fraction"] == 0.0 and row["rollout/version_max"] == 0
    assert math.isfinite(row["actor/loss"]) and row["actor/grad_norm"] > 0
    # on-policy (staleness 0): the fake's log-probs (-2.0) are the proximal ones, so the
    # policy's ratio to them is far from 1 and PPO clips some tokens
    assert row["actor/clip_fraction"] > 0


class _DyingServer(ScriptOnlyEngine):
    """A server that died mid-batch: request 0 fails after one loop turn, the others
    ``delay`` turns later (one more connection refused each), the last never answers."""

    pad_id = 0

    def __init__(self, delay: int) -> None:
        self.delay, self.requests = delay, 0

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        k = self.requests
        self.requests += 1
        if k == B * N - 1:
            await asyncio.Event().wait()
        for _ in range(1 + (self.delay if k else 0)):
            await asyncio.sleep(0)
        raise ServerError("127.0.0.1:1", f"request {k} refused")


def test_a_dead_server_leaves_no_task_behind_in_sync_mode(tiny, caplog):
    """The batch fails with the first request's error, and every other request is settled:
    none is logged later as "Task exception was never retrieved" (such a traceback came after
    the trainer's one-line error when a vLLM server was killed, when a later failure landed in
    the loop turn where the executor's loop stopped; the delays sweep that turn)."""
    _, tok, records = tiny
    ctx = _context(tok, [tok.eos_token_id], _verifiable())
    caplog.set_level(logging.ERROR, logger="asyncio")
    for delay in range(12):
        engine = _DyingServer(delay)
        ex = _sync(engine, RLVRWorkflow(ctx), ctx, records)
        message = ""
        try:
            ex.next_batch()
        except RolloutServerError as exc:
            message = str(exc)
        finally:
            ex.close()
        gc.collect()
        assert message == "rollout server 127.0.0.1:1: request 0 refused"
        assert engine.requests == B * N
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == [], delay
