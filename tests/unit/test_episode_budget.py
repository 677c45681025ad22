"""The one length contract: ``rollout.max_episode_tokens`` resolved and checked when the config
is read, vLLM's context length derived from it, each turn's request cut to what it leaves, and
no training row longer than it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from areal_m2po.api.cli_args import ConfigError, GenerationConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.api.engine_api import SamplingParams
from areal_m2po.api.workflow_api import Trajectory, TrajectoryGroup, WorkflowContext
from areal_m2po.rollout.batch_builder import check_groups
from areal_m2po.rollout.factory import vllm_max_model_len
from areal_m2po.rollout.workflows.multi_turn.workflow import MultiTurnWorkflow
from areal_m2po.utils.tiny_tokenizer import build_tiny_tokenizer


def test_the_budget_is_derived_from_the_longest_prompt_and_one_turn() -> None:
    cfg = load_config(
        ["train_dataset.max_prompt_length=40", "valid_dataset.max_prompt_length=70"]
        + ["gconfig.max_new_tokens=12"]
    )
    assert cfg.episode_budget == 70 + 12  # the held-out prompts are the longer ones
    assert vllm_max_model_len(cfg) == 82
    cfg = load_config(["valid_dataset.max_prompt_length=30", "gconfig.max_new_tokens=12"])
    assert cfg.episode_budget == 256 + 12  # train_dataset's default
    cfg = load_config(["rollout.max_episode_tokens=500", "rollout.vllm.max_model_len=600"])
    assert cfg.episode_budget == 500 and vllm_max_model_len(cfg) == 600
    assert vllm_max_model_len(load_config(["rollout.max_episode_tokens=500"])) == 500


def test_a_derived_budget_is_capped_by_gconfig_max_tokens() -> None:
    """No engine call may hold more than gconfig.max_tokens (prompt + generated), so neither
    may an episode: without the cap a multi-turn episode grew past it and the engine refused
    its next turn, which stopped the run."""
    base = ["train_dataset.max_prompt_length=128", "valid_dataset.max_prompt_length=64"]
    cfg = load_config([*base, "gconfig.max_new_tokens=8", "gconfig.max_tokens=132"])
    assert cfg.episode_budget == 132
    cfg = load_config([*base, "gconfig.max_new_tokens=8", "gconfig.max_tokens=1000"])
    assert cfg.episode_budget == 136  # the cap is above the derived budget
    explicit = ["rollout.max_episode_tokens=300", "gconfig.max_tokens=132"]
    assert load_config([*base, *explicit]).episode_budget == 300  # as set
    with pytest.raises(ConfigError, match=r"episode of 132 tokens \(gconfig.max_tokens\)"):
        load_config([*base, "gconfig.max_tokens=132", "rollout.vllm.max_model_len=130"])


@pytest.mark.parametrize(
    ("overrides", "key", "detail"),
    [
        (
            ["rollout.max_episode_tokens=100", "gconfig.max_new_tokens=16"],
            "rollout.max_episode_tokens",
            "100 cannot hold a prompt of train_dataset.max_prompt_length (256) and a turn of "
            "gconfig.max_new_tokens (16): set at least 272",
        ),
        (
            ["rollout.vllm.max_model_len=200"],
            "rollout.vllm.max_model_len",
            "200 cannot hold an episode of 272 tokens (train_dataset.max_prompt_length + "
            "gconfig.max_new_tokens)",
        ),
        (["rollout.max_episode_tokens=1"], "rollout.max_episode_tokens", ">= 2"),
        (["rollout.episode_timeout_s=0"], "rollout.episode_timeout_s", "> 0"),
    ],
)
def test_a_budget_that_cannot_work_is_refused_at_config_read(
    overrides: list[str], key: str, detail: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    assert caught.value.key == key and detail in caught.value.detail
    assert "\n" not in str(caught.value)


def test_a_budget_past_the_models_positions_is_refused(tmp_path: Path) -> None:
    from areal_m2po.trainer.preflight import check_config

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    cfg = load_config([f"actor.path={tmp_path}", "train_dataset.max_prompt_length=64"])
    with pytest.raises(
        ConfigError, match="more than the model's max_position_embeddings"
    ) as caught:
        check_config(cfg)  # a start-up check: building the config read no file
    assert caught.value.key == "valid_dataset.max_prompt_length"  # its default fills 128
    assert "(128, " in str(caught.value) and str(caught.value).endswith("; set it at most 112")
    assert f"{tmp_path}/config.json" in str(caught.value)
    cfg = load_config(
        [f"actor.path={tmp_path}", "train_dataset.max_prompt_length=64"]
        + ["valid_dataset.max_prompt_length=64", "gconfig.max_new_tokens=64"]
    )
    assert cfg.episode_budget == 128  # exactly the model's positions is fine
    check_config(cfg)


def test_the_rollout_factory_applies_the_same_positions_rule() -> None:
    from types import SimpleNamespace

    from areal_m2po.rollout.factory import check_model_positions

    cfg = load_config(["train_dataset.max_prompt_length=64", "valid_dataset.max_prompt_length=64"])
    check_model_positions(cfg, SimpleNamespace(max_position_embeddings=80))  # 64 + 16 fits
    with pytest.raises(ConfigError) as caught:
        check_model_positions(cfg, SimpleNamespace(max_position_embeddings=79))
    assert caught.value.key == "gconfig.max_new_tokens"
    assert "need 80 positions" in str(caught.value) and "(79, " in str(caught.value)
    assert "set gconfig.max_new_tokens to at most 15 (or lower " in str(caught.value)
    check_model_positions(cfg, SimpleNamespace())  # a config without the number: no rule


def _context(budget: int | None, tokenizer: Any = None) -> WorkflowContext:
    g = GenerationConfig(max_new_tokens=10, min_new_tokens=4)
    return WorkflowContext(tokenizer, g, SamplingParams.from_gconfig(g), [0], None, budget)


def test_turn_sampling_asks_for_what_the_budget_leaves() -> None:
    ctx = _context(50)
    assert ctx.turn_sampling(40) is ctx.sampling  # 10 left: the whole turn
    cut = ctx.turn_sampling(47)
    assert cut is not None and (cut.max_new_tokens, cut.min_new_tokens) == (3, 3)
    assert cut.temperature == ctx.sampling.temperature
    assert ctx.turn_sampling(49).max_new_tokens == 1  # type: ignore[union-attr]
    assert ctx.turn_sampling(50) is None and ctx.turn_sampling(60) is None
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    assert ctx.turn_sampling(45, greedy) == SamplingParams(max_new_tokens=5, temperature=0.0)
    unbounded = _context(None)
    assert unbounded.turn_sampling(10**6) is unbounded.sampling


def _traj(n: int) -> Trajectory:
    return Trajectory(list(range(n)), [False] + [True] * (n - 1), [0.0] * n, [0] * n, 1)


def test_no_row_longer_than_the_budget_reaches_the_batch() -> None:
    check_groups([TrajectoryGroup([_traj(12), _traj(5)])], 2, "mine", max_episode_tokens=12)
    with pytest.raises(ValueError, match=r"rollout.workflow mine: a trajectory holds 13 tokens"):
        check_groups([TrajectoryGroup([_traj(5), _traj(13)])], 2, "mine", max_episode_tokens=12)
    check_groups([TrajectoryGroup([_traj(500), _traj(5)])], 2, "mine")  # no budget


def test_multi_turn_total_defaults_to_the_budget_and_may_not_exceed_it() -> None:
    tokenizer = build_tiny_tokenizer()
    ctx = _context(300, tokenizer)
    assert MultiTurnWorkflow(ctx, environment="calculator").max_total_tokens == 300
    wf = MultiTurnWorkflow(ctx, environment="calculator", max_total_tokens=200)
    assert wf.max_total_tokens == 200
    with pytest.raises(ValueError, match=r"max_total_tokens: 301 exceeds the episode budget"):
        MultiTurnWorkflow(ctx, environment="calculator", max_total_tokens=301)


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["gconfig.max_new_tokens=100000"], "gconfig.max_new_tokens", "100"),
        (["rollout.max_episode_tokens=1000"], "rollout.max_episode_tokens", "128"),
        (
            ["gconfig.max_new_tokens=100000", "rollout.max_episode_tokens=100028"],
            "gconfig.max_new_tokens",
            "100",
        ),
        (["train_dataset.max_prompt_length=200"], "train_dataset.max_prompt_length", "120"),
    ],
)
def test_the_positions_advice_when_followed_passes(tmp_path: Path, overrides, key, fix) -> None:
    """Issue 57: a huge gconfig.max_new_tokens was told to lower rollout.max_episode_tokens,
    and that, set, was told to be at least prompt + max_new_tokens. The key named and the
    value advised (here: at most 128 positions, prompts of 28) must make the check pass."""
    from areal_m2po.trainer.preflight import check_config

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    base = [f"actor.path={tmp_path}", "gconfig.max_new_tokens=8"]
    base += ["train_dataset.max_prompt_length=28", "valid_dataset.max_prompt_length=28"]
    with pytest.raises(ConfigError) as caught:
        check_config(load_config(base + overrides))
    assert caught.value.key == key, str(caught.value)
    assert f"at most {fix}" in str(caught.value)
    fixed = [o for o in overrides if not o.startswith(key)] + [f"{key}={fix}"]
    if key == "gconfig.max_new_tokens" and any("max_episode" in o for o in overrides):
        fixed = [f"{key}={fix}"]  # then rollout.max_episode_tokens is named next; null it
    check_config(load_config(base + fixed))
