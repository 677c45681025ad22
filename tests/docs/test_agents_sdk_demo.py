"""examples/agents_sdk_demo.py and its agent: the SFT transcripts and the agent's tool call by
hand, and (slow) every stage of the demo at tiny size, resumed by rerunning it."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("agents")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def ex():
    return runpy.run_path(str(EXAMPLES / "agents_sdk_demo.py"), run_name="example_sdk_demo")


@pytest.fixture(scope="module")
def agent_module(ex):
    return ex["_agent_module"]()


def test_transcripts_call_calc_in_the_hermes_format_and_answer_its_result(ex, agent_module):
    from areal_m2po.dataset.multiplication import make_multiplication_split
    from areal_m2po.rollout.openai.tool_parsers import tool_call_parser

    records = ex["tool_call_transcripts"](4, seed=3)
    problems = make_multiplication_split("train", n=4, seed=3)
    for record, problem in zip(records, problems, strict=True):
        system, user, call, result, answer = record["messages"]
        assert system == {"role": "system", "content": agent_module.INSTRUCTIONS}
        assert user["content"] == problem["question"].split("?")[0] + "?"  # no <calc> hint
        a, b = (int(x) for x in user["content"][len("What is ") : -1].split(" * "))
        assert a * b == int(problem["answer"])
        assert call["content"] == (
            '<tool_call>{"name": "calc", "arguments": {"expression": "' + f"{a}*{b}" + '"}}'
            "</tool_call>"
        )
        content, calls = tool_call_parser("hermes")(call["content"])
        assert content == "" and len(calls) == 1
        assert calls[0]["function"]["name"] == "calc"
        assert json.loads(calls[0]["function"]["arguments"]) == {"expression": f"{a}*{b}"}
        assert result == {"role": "tool", "content": str(a * b)}
        assert answer == {"role": "assistant", "content": str(a * b)}


def test_question_of_refuses_another_task(agent_module):
    assert agent_module.question_of({"question": "What is 12 * 34? You have..."}) == (
        "What is 12 * 34?"
    )
    with pytest.raises(ValueError, match="not a builtin:multiplication question"):
        agent_module.question_of({"question": "2+2"})


@pytest.mark.slow
def test_tiny_demo_runs_every_stage_and_resumes(ex, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    summary = ex["main"](["--tiny", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "[0/2] before" in out and "[1/2] SFT" in out and "[2/2] RL step 0" in out
    assert summary["before"]["n"] == 4 and summary["before"]["calls"] >= 1.0
    assert summary["sft"]["steps"] == 2 and summary["sft"]["examples"] == 8
    rl = summary["rl"]
    assert [e["step"] for e in rl["evals"]] == [0, 1, 2]  # the trainer's agent evaluation
    assert all(e["n"] == 4 and 0.0 <= e["tool_use"] <= 1.0 for e in rl["evals"])
    assert [t["step"] for t in rl["train"]] == [1, 2]
    cfg = yaml.safe_load((tmp_path / "rl" / "config.yaml").read_text())
    assert cfg["actor"]["path"] == summary["sft"]["path"]  # RL starts from the SFT model
    assert cfg["rollout"]["workflow_kwargs"]["agent"] == "sdk_calculator_agent:SdkCalculatorAgent"
    assert cfg["rollout"]["agent"]["tool_call_parser"] == "hermes"
    assert (tmp_path / "rl" / "recover").is_dir()
    before = (tmp_path / "before.json").read_text()
    # rerun with one more RL step: before and SFT are kept, RL resumes at step 3
    again = ex["main"](["--tiny", "--output-dir", str(tmp_path), "--rl-steps", "3"])
    assert (tmp_path / "before.json").read_text() == before
    assert again["sft"]["path"] == summary["sft"]["path"]
    assert [t["step"] for t in again["rl"]["train"]] == [1, 2, 3]
