"""AReaL's agent contract: which agents follow it, per-interaction rewards with the turn
discount (hand-derived numbers), bad reward values, and the rollout.agent keys."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

from areal_m2po.api.config.agent import AgentConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.rollout.workflows.agent.areal_agent import (
    DropCounter,
    InteractionRewardError,
    discounted_rewards,
    interaction_rewards,
    resolve_agent,
)

KEY = "rollout.workflow_kwargs.agent"


class ArealStyle:
    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        return 1.0


async def areal_function(data: dict[str, Any], **extra_kwargs: Any) -> float:
    return 1.0


async def ours(base_url: str, api_key: str, record: dict[str, Any]) -> float:
    return 1.0


def test_the_contract_is_recognised() -> None:
    entry = resolve_agent(ArealStyle, KEY)
    assert entry.areal and entry.name == "ArealStyle" and entry.fn.__name__ == "run"
    assert resolve_agent(ArealStyle(), KEY).areal
    assert resolve_agent(areal_function, KEY).areal
    assert not resolve_agent(ours, KEY).areal
    with pytest.raises(ValueError, match=f"{KEY}: required"):
        resolve_agent(None, KEY)
    with pytest.raises(ValueError, match="must be an async function"):
        resolve_agent(lambda data, **kw: 1.0, KEY)


def test_a_missing_agents_sdk_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sdk_user_agent.py").write_text(
        "import agents\n\n\nasync def run(data, **kw):\n    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "agents", None)  # as if openai-agents were not installed
    with pytest.raises(ValueError) as caught:
        resolve_agent("sdk_user_agent:run", KEY)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(KEY)
    assert "OpenAI Agents SDK" in message and "areal_m2po[agents]" in message


def test_backward_discount_by_hand() -> None:
    # own rewards of 4 interactions; g = 0.5:
    # r3 = 2; r2 = 0 + 0.5*2 = 1; r1 = 1 + 0.5*1 = 1.5; r0 = 0 + 0.5*1.5 = 0.75
    assert discounted_rewards([None, 1.0, None, 2.0], 0.5) == [0.75, 1.5, 1.0, 2.0]
    assert discounted_rewards([3.0, None], 0.9) == [3.0, 0.0]  # the last has none: 0
    assert discounted_rewards([0.0, 0.0, 1.0], 1.0) == [1.0, 1.0, 1.0]
    assert discounted_rewards([], 0.5) == []


def test_interaction_rewards_follow_ids_and_choices() -> None:
    ids = {"chatcmpl-a": [0], "resp_b": [1, 2], "chatcmpl-c": [3]}  # resp_b: two choices
    rewards = interaction_rewards(4, ids, {"resp_b": 1.0, "chatcmpl-c": 0.5}, 0.8)
    # r3 = 0.5; r2 = 1 + 0.8*0.5 = 1.4; r1 = 1 + 0.8*1.4 = 2.12; r0 = 0.8*2.12 = 1.696
    assert rewards == pytest.approx([1.696, 2.12, 1.4, 0.5])
    assert interaction_rewards(4, ids, 2.0, 0.5) == [0.25, 0.5, 1.0, 2.0]  # a float: the last
    assert interaction_rewards(2, {}, 1, 1.0) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"chatcmpl-nope": 1.0}, "reward keyed by 'chatcmpl-nope', which no call"),
        ({"chatcmpl-a": math.nan}, "not a finite number"),
        ({3: 1.0}, "reward keyed by '3'"),
        (True, "not a finite number"),
        ("1.0", "not a finite number"),
        (None, "not a finite number"),
    ],
)
def test_bad_reward_values_are_named(result: Any, message: str) -> None:
    with pytest.raises(InteractionRewardError, match=message):
        interaction_rewards(1, {"chatcmpl-a": [0]}, result, 1.0)


def test_drop_counter_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    counter = DropCounter()
    counter.add("agent X raised on record 'q': KeyError: 'a'")
    counter.add("second")
    assert counter.take() == 2 and counter.take() == 0
    assert [r.getMessage() for r in caplog.records][0] == (
        "agent episode dropped: agent X raised on record 'q': KeyError: 'a'"
    )


def test_rollout_agent_keys_load_with_their_meaning() -> None:
    cfg = load_config(
        [
            "rollout.agent.mode=inline",
            "rollout.agent.export_style=concat",
            "rollout.agent.turn_discount=0.9",
            "rollout.agent.tool_call_parser=qwen25",
            "rollout.agent.reasoning_parser=qwen3",
            "rollout.agent.chat_template_type=hf",
        ]
    )
    assert cfg.rollout.agent == AgentConfig("inline", "qwen25", "qwen3", "hf", 0.9, "concat", 4)
    assert load_config(["rollout.agent.mode=subproc"]).rollout.agent.mode == "subproc"
    for override, named in [
        ("rollout.agent.mode=online", "rollout.agent: mode: online"),
        ("rollout.agent.subproc_max_workers=0", "rollout.agent: subproc_max_workers"),
        ("rollout.agent.turn_discount=1.5", "rollout.agent: turn_discount: must be"),
        ("rollout.agent.tool_call_parser=llama9", "rollout.agent: tool_call_parser"),
        ("rollout.agent.reasoning_parser=x", "rollout.agent: reasoning_parser"),
        ("rollout.agent.chat_template_type=x", "rollout.agent: chat_template_type"),
    ]:
        with pytest.raises(ValueError) as caught:
            load_config([override])
        assert str(caught.value).startswith(named) and "\n" not in str(caught.value)


def test_an_areal_config_s_agent_section_is_read_with_its_meaning(tmp_path: Path) -> None:
    import yaml

    repo = Path(__file__).resolve().parents[2]
    data = yaml.safe_load((repo / "tests/data/areal/examples/math/gsm8k_grpo_cpu.yaml").read_text())
    # the section of AReaL's examples/agent_workflow/config.yaml at cbff54d6
    data["rollout"]["agent"] = {
        "mode": "inline",
        "tool_call_parser": "qwen25",
        "reasoning_parser": "qwen3",
        "export_style": "individual",
        "turn_discount": 1.0,
    }
    path = tmp_path / "areal.yaml"
    path.write_text(yaml.safe_dump(data))
    # AReaL applies the style only to agents behind its proxy: the rlvr workflow loads
    cfg = load_config(["--config", str(path)], warn=lambda line: None)
    assert cfg.rollout.workflow == "rlvr" and cfg.rollout.agent.export_style == "individual"
    with pytest.raises(ValueError) as caught:  # the one unsupported feature, named
        load_config(["--config", str(path), "rollout.workflow=agent"], warn=lambda line: None)
    assert str(caught.value).startswith("rollout.agent.export_style: individual")
