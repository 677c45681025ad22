"""AReaL's agent contract and the OpenAI Agents SDK through the agent workflow: an ``Agent``
with a function tool (Responses and chat-completions models, streamed and not) and AReaL's
handoff math agent (vendored unchanged) run against the endpoint; their per-interaction
rewards, the turn discount and bad outcomes (an agent that raises, rewards for unknown ids,
one that never returns) reach the episode as AReaL defines them."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sdk_agents
from agentic_helpers import tiny_model_and_tokenizer
from scripted_engine import ScriptOnlyEngine

from areal_m2po.api.cli_args import GenerationConfig
from areal_m2po.api.config.agent import AgentConfig
from areal_m2po.api.engine_api import ModelRequest, ModelResponse, SamplingParams
from areal_m2po.api.workflow_api import WorkflowContext
from areal_m2po.rollout.executor import arun_group
from areal_m2po.rollout.workflows.agent.workflow import AgentWorkflow

CALL = '<tool_call>{"name": "calc", "arguments": {"expression": "37*45"}}</tool_call>'
RECORD = {"question": "What is 37*45?", "answer": "1665"}


class Scripted(ScriptOnlyEngine):
    """Answers each call with the next scripted text and EOS; log-prob -0.01*(i+1)."""

    version = 5

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.tokenizer, self.texts, self.requests = tokenizer, list(texts), []

    async def agenerate(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        text = self.texts.pop(0) + "<|im_end|>"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        lp = [-0.01 * (i + 1) for i in range(len(ids))]
        return ModelResponse(list(request.input_ids), ids, lp, [self.version] * len(ids), "stop")


def _workflow(tokenizer: Any, agent: Any, discount: float = 1.0) -> AgentWorkflow:
    g = GenerationConfig(n_samples=1, max_new_tokens=200, temperature=1.0)
    context = WorkflowContext(
        tokenizer,
        g,
        SamplingParams.from_gconfig(g),
        [tokenizer.eos_token_id],
        None,
        agent_config=AgentConfig(turn_discount=discount),
    )
    return AgentWorkflow(context, agent=agent)


def _group(workflow: AgentWorkflow, engine: Any, timeout: float | None = None) -> Any:
    try:
        return asyncio.run(arun_group(workflow, engine, dict(RECORD), 1, "agent", timeout))
    finally:
        workflow.close()


@pytest.mark.parametrize(
    "agent", [sdk_agents.SdkToolAgent, sdk_agents.SdkChatToolAgent, sdk_agents.SdkStreamedToolAgent]
)
def test_an_sdk_agent_with_a_function_tool_runs_and_its_episode_is_one_trajectory(
    agent: type,
) -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    engine = Scripted(tokenizer, [CALL, "It is 1665."])
    agent.first_reward = 0.1
    workflow = _workflow(tokenizer, agent, discount=0.5)
    group = _group(workflow, engine)
    assert group is not None and engine.texts == []  # the tool call, then the answer
    traj = group.trajectories[0]
    assert group.stats["agent/calls"] == 2 and group.stats["agent/untrained_calls"] == 0
    assert group.stats["agent/tool_episodes"] == 1.0  # its first reply was parsed as a call
    # the tool's result went back to the model as a tool turn of the same token sequence
    text = tokenizer.decode(traj.input_ids)
    assert "<|im_start|>tool\n1665<|im_end|>" in text
    masked = tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m])
    assert masked == CALL + "<|im_end|>" + "It is 1665.<|im_end|>"
    assert {v for v, m in zip(traj.versions, traj.loss_mask) if m} == {5}
    first, second = engine.requests
    assert second.input_ids[: len(first.input_ids)] == first.input_ids  # merged, not re-rendered
    final = sdk_agents.digit_fraction("It is 1665.")  # 4 digits in 11 characters
    if agent.api == "responses":  # {first: 0.1, last: 4/11}; g = 0.5
        assert traj.info["interaction_rewards"] == pytest.approx([0.1 + 0.5 * final, final])
    else:  # a float: the last interaction's
        assert traj.info["interaction_rewards"] == pytest.approx([0.5 * final, final])
    assert traj.reward == pytest.approx(final)  # concat: the chain's last interaction


@pytest.mark.parametrize(
    ("texts", "used_tool"), [([CALL, "It is 1665."], 1.0), (["It is 1665."], 0.0)]
)
def test_the_evaluation_of_an_sdk_agent_counts_its_tool_use(
    texts: list[str], used_tool: float
) -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    workflow = _workflow(tokenizer, sdk_agents.SdkToolAgent)
    engine = Scripted(tokenizer, texts)
    try:
        result = asyncio.run(workflow.aevaluate(engine, dict(RECORD)))
    finally:
        workflow.close()
    assert engine.texts == [] and result is not None
    assert result["tool_use_fraction"] == used_tool
    assert result["calls_mean"] == float(len(texts))


def test_areal_handoff_math_agent_runs_unchanged() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    handoff = '<tool_call>{"name": "solve_problem", "arguments": {}}</tool_call>'
    engine = Scripted(tokenizer, [handoff, "The answer is 1665."])
    agent = sdk_agents.ArealMathAgent()
    workflow = _workflow(tokenizer, agent)
    group = _group(workflow, engine)
    assert group is not None and engine.texts == [] and agent.last_agent == "Solution Specialist"
    first, second = (tokenizer.decode(r.input_ids) for r in engine.requests)
    assert "math problem solving coordinator" in first  # (this template renders no tools)
    assert "math solution specialist" in second
    traj = group.trajectories[0]
    expected = sdk_agents.digit_fraction("The answer is 1665.")
    assert traj.reward == pytest.approx(expected)
    masked = tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m])
    assert masked.endswith("The answer is 1665.<|im_end|>")


class Raises:
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        raise KeyError("answer_key")


class UnknownIds:
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> dict[str, float]:
        import openai

        client = openai.AsyncOpenAI(
            base_url=extra_kwargs["base_url"], api_key=extra_kwargs["api_key"], max_retries=0
        )
        await client.chat.completions.create(
            model="p", messages=[{"role": "user", "content": "hi"}]
        )
        return {"chatcmpl-not-a-call": 1.0}


class NeverReturns:
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        await asyncio.sleep(3600)
        return 1.0


@pytest.mark.parametrize(
    ("agent", "logged"),
    [
        (Raises, "agent Raises raised on record 'What is 37*45?': KeyError: 'answer_key'"),
        (UnknownIds, "reward keyed by 'chatcmpl-not-a-call', which no call of the episode"),
    ],
)
def test_a_failing_areal_agent_drops_its_episode_and_is_counted(
    agent: type, logged: str, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    workflow = _workflow(tokenizer, agent)
    engine = Scripted(tokenizer, ["hello"])
    with caplog.at_level("WARNING", logger="areal_m2po.agent"):
        assert _group(workflow, engine) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "areal_m2po.agent"]
    assert len(lines) == 1 and logged in lines[0] and "\n" not in lines[0]
    assert workflow.finish_batch([]) == {"agent/dropped_episodes": 1.0}
    assert workflow.finish_batch([]) == {"agent/dropped_episodes": 0.0}


def test_an_areal_agent_that_never_returns_is_cancelled_at_the_episode_timeout() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    workflow = _workflow(tokenizer, NeverReturns)
    timed_out: list[int] = []

    async def run() -> Any:
        return await arun_group(
            workflow, Scripted(tokenizer, []), dict(RECORD), 1, "agent", 0.5, timed_out.append
        )

    try:
        assert asyncio.run(run()) is None
    finally:
        workflow.close()
    assert timed_out == [1] and workflow.proxy.sessions == {}  # its session closed


REPO = Path(__file__).resolve().parents[2]


def _train(run_dir: Path, *extra: str) -> list[dict[str, Any]]:
    """A 2-step training run in a subprocess (the agents import from tests/support)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests" / "support")]))
    env["OMP_NUM_THREADS"] = "1"
    args = [
        "--config", str(REPO / "configs" / "tiny.yaml"), f"output_dir={run_dir}",
        "total_train_steps=2", "saver.save_at_end=false", "evaluator.eval_at_end=false",
        "reward.path=toy_rewards:digit_fraction", "num_threads=1", "rollout.workflow=agent",
        "rollout.agent.turn_discount=0.9", "rollout.agent.export_style=concat",
        "rollout.agent.tool_call_parser=qwen25", *extra,
    ]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "areal_m2po.train", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.mark.slow
def test_an_sdk_agent_trains_on_the_tiny_model(tmp_path: Path) -> None:
    rows = _train(
        tmp_path / "run",
        "rollout.workflow_kwargs={agent: 'sdk_agents:SdkToolAgent'}",
        "gconfig.max_new_tokens=6",
        "rollout.max_episode_tokens=500",  # the agent's instructions come on top of the prompt
    )
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # 4 prompts x 4 episodes, each a Runner.run of the SDK agent
        assert r["agent/episodes"] == 16 and r["agent/calls"] >= 16
        assert r["agent/dropped_episodes"] == 0 and r["rollout/n_dropped_groups"] == 0
        assert math.isfinite(r["actor/loss"])


@pytest.mark.slow
def test_areal_handoff_math_agent_trains_on_the_builtin_model(tmp_path: Path) -> None:
    # its instructions are 1346 characters: past the tiny model's 512 positions, so the
    # built-in SmolLM2-135M-Instruct (BPE, 2048 positions) runs it, at the smallest size
    rows = _train(
        tmp_path / "run",
        "rollout.workflow_kwargs={agent: 'sdk_agents:ArealMathAgent'}",
        "actor.path=builtin:smollm2-135m-instruct",
        "ref.path=builtin:smollm2-135m-instruct",
        "gconfig.n_samples=2",
        "gconfig.max_new_tokens=4",
        "train_dataset.batch_size=2",
        "rollout.max_episode_tokens=1024",
    )
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["agent/episodes"] == 4 and r["agent/calls"] >= 4
        assert r["agent/dropped_episodes"] == 0 and math.isfinite(r["actor/loss"])


def test_subproc_mode_runs_the_agent_in_a_worker_process(tmp_path: Path) -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    g = GenerationConfig(n_samples=1, max_new_tokens=50, temperature=1.0)
    context = WorkflowContext(
        tokenizer,
        g,
        SamplingParams.from_gconfig(g),
        [tokenizer.eos_token_id],
        None,
        agent_config=AgentConfig(mode="subproc", subproc_max_workers=1),
    )
    workflow = AgentWorkflow(context, agent="sdk_agents:EnvClientAgent")
    engine = Scripted(tokenizer, ["It is 1665."])
    record = {**RECORD, "pid_file": str(tmp_path / "pid")}
    try:
        group = asyncio.run(arun_group(workflow, engine, record, 1, "agent"))
    finally:
        workflow.close()
    assert group is not None and engine.texts == []
    assert int((tmp_path / "pid").read_text()) != os.getpid()
    traj = group.trajectories[0]
    assert traj.reward == pytest.approx(sdk_agents.digit_fraction("It is 1665."))
    masked = tokenizer.decode([t for t, m in zip(traj.input_ids, traj.loss_mask) if m])
    assert masked == "It is 1665.<|im_end|>"


def test_subproc_mode_refuses_an_agent_of_the_other_contract() -> None:
    tokenizer = tiny_model_and_tokenizer()[1]
    g = GenerationConfig(n_samples=1, max_new_tokens=8)
    context = WorkflowContext(
        tokenizer,
        g,
        SamplingParams.from_gconfig(g),
        [2],
        None,
        agent_config=AgentConfig(mode="subproc"),
    )

    async def ours(base_url: str, api_key: str, record: dict[str, Any]) -> float:
        return 0.0

    with pytest.raises(ValueError, match="rollout.agent.mode: subproc runs agents in AReaL"):
        AgentWorkflow(context, agent=ours)
