"""AReaL's capacity rule (rollout/staleness.py) and the async executor that applies it.

The property test drives the real :class:`AsyncRolloutExecutor` and
:class:`RemoteSGLangEngine` (the HTTP client replaced by fake servers) with
random per-token delays (one deliberately slow, one fast) and a trainer that takes a random
time per step; weight updates land mid-generation, so samples span versions. For every trained
token, trainer version - token version <= max_head_offpolicyness must hold, and no more than
max_concurrent_rollouts samples may ever be in flight.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.api.workflow_api import (
    RolloutWorkflow,
    Trajectory,
    TrajectoryGroup,
    WorkflowContext,
)
from areal_m2po.rollout.async_executor import AsyncRolloutExecutor
from areal_m2po.rollout.batch_builder import groups_to_batch
from areal_m2po.rollout.engines.remote.base import RemoteEngineOptions
from areal_m2po.rollout.engines.remote.errors import RolloutServerError, ServerError
from areal_m2po.rollout.engines.remote.sglang import RemoteSGLangEngine
from areal_m2po.rollout.executor import RolloutSetup
from areal_m2po.rollout.staleness import StalenessBudget


def test_budget_by_hand():
    b = StalenessBudget(
        groups_per_batch=2, samples_per_group=4, max_head_offpolicyness=1, max_concurrent_samples=12
    )
    # version delta 0: (1 + 0 + 1) * 2 = 4 groups may ever start
    assert b.groups_allowed(0) == 4
    assert b.can_start(started_groups=0, running_samples=0, version_delta=0) == 3  # 12 // 4
    assert b.can_start(started_groups=3, running_samples=0, version_delta=0) == 1
    assert b.can_start(started_groups=4, running_samples=0, version_delta=0) == 0
    assert b.can_start(started_groups=4, running_samples=0, version_delta=1) == 2
    assert b.can_start(started_groups=4, running_samples=9, version_delta=1) == 0  # 3 left < 4
    assert b.train_delta(3) == 1 and b.train_delta(4) == 2


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(max_head_offpolicyness=-1), "max_head_offpolicyness"),
        (dict(max_concurrent_samples=3), "max_concurrent_rollouts"),
        (dict(groups_per_batch=0), "groups_per_batch"),
    ],
)
def test_budget_bad_input(kw, msg):
    args = dict(
        groups_per_batch=2, samples_per_group=4, max_head_offpolicyness=0, max_concurrent_samples=8
    )
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        StalenessBudget(**args)


def test_groups_to_batch_layout():
    a = ModelResponse([1, 2, 3], [7, 8], [-0.5, -0.25], [0, 1], "stop")
    b = ModelResponse([4], [9, 9, 9], [-1.0, -2.0, -3.0], [1, 1, 1], "length")
    groups = [
        TrajectoryGroup([Trajectory.from_response(a, 1.0)]),
        TrajectoryGroup([Trajectory.from_response(b, 0.5)]),
    ]
    batch = groups_to_batch(groups, pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 7, 8, 0], [0, 0, 4, 9, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]]
    assert batch["versions"].tolist() == [[-1, -1, -1, 0, 1, -1], [-1, -1, -1, 1, 1, 1]]
    assert batch["behave_logp"][0, 3:5].tolist() == [-0.5, -0.25]
    assert batch["behave_logp"][1].tolist() == [0.0, 0.0, 0.0, -1.0, -2.0, -3.0]
    assert batch["no_eos"].tolist() == [False, True]
    assert batch["rewards"].tolist() == [1.0, 0.5]
    assert {k: v.dtype for k, v in batch.items()} == {
        "input_ids": torch.int64,
        "attention_mask": torch.bool,
        "loss_mask": torch.bool,
        "behave_logp": torch.float32,
        "versions": torch.int64,
        "rewards": torch.float32,
        "no_eos": torch.bool,
    }


def test_groups_to_batch_multi_turn_layout():
    """A trajectory with an inserted (tool) turn: the prompt left of P, everything after it on
    the right, the tool tokens attended but not trained on."""
    t = Trajectory(
        input_ids=[1, 2, 5, 6, 9, 7],
        loss_mask=[False, False, True, True, False, True],
        logprobs=[0.0, 0.0, -0.1, -0.2, 0.0, -0.3],
        versions=[-1, -1, 3, 3, -1, 4],
        prompt_len=2,
    )
    short = Trajectory(
        [8, 8, 8, 4], [False, False, False, True], [0.0] * 3 + [-1.0], [-1] * 3 + [4], 3
    )
    batch = groups_to_batch([TrajectoryGroup([t, short])], pad_id=0)
    assert batch["input_ids"].tolist() == [[0, 1, 2, 5, 6, 9, 7], [8, 8, 8, 4, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 0, 0, 1, 1, 0, 1], [0, 0, 0, 1, 0, 0, 0]]
    assert batch["versions"].tolist() == [[-1, -1, -1, 3, 3, -1, 4], [-1, -1, -1, 4, -1, -1, -1]]


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(loss_mask=[True, True, False]), "inside the prompt"),
        (dict(logprobs=[0.0]), "lengths"),
        (dict(prompt_len=0), "prompt_len"),
        (dict(reward=float("nan")), "finite"),
    ],
)
def test_trajectory_bad_input(kw, msg):
    args = dict(
        input_ids=[1, 2, 3], loss_mask=[False, False, True], logprobs=[0.0, 0.0, -1.0],
        versions=[-1, -1, 0], prompt_len=2,
    )  # fmt: skip
    args.update(kw)
    with pytest.raises(ValueError, match=msg):
        Trajectory(**args)


class FakeServers:
    """The HTTP client of the remote engine, answering for SGLang-protocol servers that emit
    one token per ``delay[addr]`` seconds; a pause cuts running requests short (finish
    ``abort``), and each reply is stamped with the version its server held when it began."""

    def __init__(self, delays: dict[str, float], dead: set[str] | None = None) -> None:
        self.delays = delays
        self.version = dict.fromkeys(delays, 0)
        self.paused = dict.fromkeys(delays, False)
        self.dead = dead or set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.serving = False

    async def call(self, addr, call):
        if call.endpoint == "/generate":
            return await self._generate(addr, call.payload)
        if call.endpoint == "/pause_generation":
            self.paused[addr] = True
        elif call.endpoint == "/continue_generation":
            self.paused[addr] = False
        elif call.endpoint == "/update_weights_from_disk":
            await asyncio.sleep(0.001)
            self.version[addr] = int(call.payload["weight_version"])
            return {"success": True}
        return {}

    async def _generate(self, addr, payload):
        self.serving = True
        if addr in self.dead:
            raise ServerError(addr, "/generate failed: ConnectError")
        version = self.version[addr]
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        out, finish = [], "length"
        try:
            for _ in range(payload["sampling_params"]["max_new_tokens"]):
                await asyncio.sleep(self.delays[addr])
                if self.paused[addr]:
                    finish = "abort"
                    break
                out.append([-1.0, 5, None])
        finally:
            self.in_flight -= 1
        meta = {"finish_reason": {"type": finish}, "weight_version": str(version)}
        return {"meta_info": {**meta, "output_token_logprobs": out}}

    async def healthy(self, addr):
        # the dead servers die once generation starts (they were healthy at start-up)
        return addr not in self.dead or not self.serving

    async def wait_healthy(self, addrs, timeout):
        assert all([await self.healthy(a) for a in addrs])

    async def aclose(self):
        pass


class _Sampler(RolloutWorkflow):
    """One request of the record's prompt per episode, reward 0 (what the budget sees of
    RLVR)."""

    async def arun_episode(self, engine, record):
        sampling = SamplingParams(max_new_tokens=3)
        return Trajectory.from_response(
            await engine.agenerate(ModelRequest(record["prompt_ids"], sampling))
        )


class _Executor:
    """The executor and engine under test, with the calls the trainer makes."""

    def __init__(self, executor: AsyncRolloutExecutor) -> None:
        self.executor = executor

    def start(self):
        self.executor.start(lambda: iter([("w", torch.zeros(1))]), 0)

    def next_batch(self):
        return self.executor.next_batch()

    def update_weights(self, version):
        self.executor.update_weights(iter([("w", torch.zeros(1))]), version)

    def close(self):
        self.executor.close()


def _remote(fake, batch_groups, n, eta, max_conc, tmp_path, tolerate=False):
    # three batches of prompts per call: prompt supply never limits, only the budget does
    records = [{"prompt_ids": [1, 2], "prompt_text": "q", "answer": "a"}] * (3 * batch_groups)
    engine = RemoteSGLangEngine(
        list(fake.delays),
        RemoteEngineOptions(
            weights_root=str(tmp_path / "weights"),
            health_check_interval=0.05,
            health_check_timeout=0.05,
            tolerate_server_failures=tolerate,
        ),
        client_factory=lambda: fake,
    )
    context = WorkflowContext(None, GenerationConfig(n_samples=n), SamplingParams(3), [0], None)
    executor = AsyncRolloutExecutor(
        RolloutSetup(engine, _Sampler(), context, pad_id=0),
        budget=StalenessBudget(batch_groups, n, eta, max_conc),
        prompt_source=lambda: (records, 0),
    )
    return _Executor(executor)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    eta=st.integers(0, 2),
    batch_groups=st.integers(1, 3),
    n=st.integers(1, 3),
    extra_conc=st.integers(0, 6),
    slow=st.floats(0.002, 0.01),
    seed=st.integers(0, 1000),
)
def test_staleness_bound_never_exceeded(
    eta, batch_groups, n, extra_conc, slow, seed, tmp_path_factory
):
    rng = random.Random(seed)
    fake = FakeServers({"slow:1": slow, "fast:2": 0.0002})
    max_conc = n + extra_conc
    remote = _remote(fake, batch_groups, n, eta, max_conc, tmp_path_factory.mktemp("w"))
    remote.start()
    try:
        worst = 0
        for step in range(4):
            batch, _ = remote.next_batch()
            assert batch["input_ids"].shape[0] == batch_groups * n
            versions = batch["versions"][batch["loss_mask"]]
            worst = max(worst, step - int(versions.min()))
            assert step - int(versions.min()) <= eta, f"step {step}: {versions.tolist()}"
            assert int(versions.max()) <= step
            # the trainer takes a random time, then every server gets version step + 1
            import time

            time.sleep(rng.uniform(0, 0.01))
            remote.update_weights(step + 1)
        assert fake.max_in_flight <= max_conc
    finally:
        remote.close()


def test_dead_server_is_named(tmp_path):
    fake = FakeServers({"a:1": 0.001}, dead={"a:1"})
    remote = _remote(fake, 1, 2, 0, 2, tmp_path)
    remote.start()
    try:
        with pytest.raises(RolloutServerError, match=r"rollout server a:1"):
            remote.next_batch()
    finally:
        remote.close()


def test_dead_server_tolerated_continues_on_the_others(tmp_path):
    fake = FakeServers({"a:1": 0.001, "b:2": 0.001}, dead={"a:1"})
    remote = _remote(fake, 2, 2, 0, 4, tmp_path, tolerate=True)
    remote.start()
    try:
        batch, info = remote.next_batch()
        assert batch["input_ids"].shape[0] == 4
        assert info["rollout/n_servers"] == 1.0
    finally:
        remote.close()
