"""examples/tool_use_demo.py: its demonstrations by hand, and every stage at tiny size."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import yaml

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tool_use_demo.py"


@pytest.fixture(scope="module")
def ex():
    return runpy.run_path(str(EXAMPLE), run_name="example_tool_use")


def test_demonstrations_call_the_tool_and_copy_its_result(ex):
    from areal_m2po.dataset.multiplication import make_multiplication_split

    records = ex["tool_demonstrations"](5, seed=3)
    questions = [r["question"] for r in make_multiplication_split("train", n=5, seed=3)]
    assert [r["messages"][0]["content"] for r in records] == questions  # training problems
    for record in records:
        user, call, result, answer = record["messages"]
        a, b = (int(x) for x in ex["_QUESTION"].match(user["content"]).groups())
        assert call == {"role": "assistant", "content": f"<calc>{a}*{b}</calc>"}
        assert result == {"role": "user", "content": f"<result>{a * b}</result>"}
        assert answer == {"role": "assistant", "content": str(a * b)}


def test_tiny_run_goes_through_every_stage(ex, tmp_path, capsys):
    summary = ex["main"](["--tiny", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "[0/2] before" in out and "[1/2] SFT" in out and "[2/2] RL step 0" in out
    assert summary["before"]["n"] == 4 and 0.0 <= summary["before"]["solved"] <= 1.0
    sft = summary["sft"]
    assert sft["steps"] == 2 and sft["examples"] == 8
    assert len((tmp_path / "sft_data.jsonl").read_text().splitlines()) == 8
    rl = summary["rl"]
    assert [e["step"] for e in rl["evals"]] == [0, 1, 2]  # the trainer's own episode evaluation
    assert all(e["n"] == 4 and 1.0 <= e["turns"] <= 3.0 for e in rl["evals"])
    assert [t["step"] for t in rl["train"]] == [1, 2]
    cfg = yaml.safe_load((tmp_path / "rl" / "config.yaml").read_text())
    assert cfg["actor"]["path"] == sft["path"]  # RL starts from the SFT model
    assert cfg["rollout"]["workflow_kwargs"]["environment"] == "calculator"
    assert (tmp_path / "summary.json").is_file()
