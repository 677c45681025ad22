"""AReaL's multi-turn workflows train on builtin:tiny through PPOTrainer (issue 56): AReaL's
MultiTurnWorkflow by AReaL's path, and a workflow in the shape of AReaL's multi-turn math
example (ArealOpenAI, discounted rewards, the concat export)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from procs import read_metrics

from areal_m2po.areal import PPOTrainer
from areal_m2po.areal.api import RolloutWorkflow
from areal_m2po.areal.api.cli_args import GRPOConfig, load_expr_config
from areal_m2po.areal.dataset import get_custom_dataset
from areal_m2po.areal.experimental.openai import ArealOpenAI
from areal_m2po.areal.utils.hf_utils import load_hf_tokenizer

pytestmark = pytest.mark.usefixtures("restore_threads")


def _config(tmp_path: Path):  # type: ignore[no-untyped-def]
    import pandas as pd

    folder = tmp_path / "gsm8k" / "main"
    folder.mkdir(parents=True)
    rows = [{"question": f"{a}+3=?", "answer": f"#### {a + 3}"} for a in range(8)]
    pd.DataFrame(rows).to_parquet(folder / "train-00000-of-00001.parquet")
    config, _ = load_expr_config(
        [
            "actor.path=builtin:tiny",
            f"output_dir={tmp_path / 'run'}",
            f"train_dataset.path={tmp_path / 'gsm8k'}",
            "train_dataset.batch_size=4",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=4",
            "total_train_steps=2",
            "rollout.max_episode_tokens=512",  # two answers and the feedback between fit
            "num_threads=1",
            "stats_logger.progress_bar=false",
        ],
        GRPOConfig,
    )
    tok = load_hf_tokenizer(config.tokenizer_path)
    train = get_custom_dataset(split="train", dataset_config=config.train_dataset, tokenizer=tok)
    return config, train


def test_multi_turn_workflow_by_arealss_path_trains(tmp_path):
    config, train = _config(tmp_path)
    calls = []

    def always_wrong(prompt, completions, prompt_ids, completion_ids, **data):  # type: ignore[no-untyped-def]
        calls.append(len(completion_ids))
        return 0.0  # every episode takes max_turns answers

    kwargs = {
        "reward_fn": always_wrong,
        "gconfig": config.gconfig,
        "tokenizer": load_hf_tokenizer(config.tokenizer_path),
        "max_turns": 2,
        "turn_discount": 0.9,
    }
    with PPOTrainer(config, train_dataset=train) as trainer:
        trainer.train(
            workflow="areal.workflow.multi_turn.MultiTurnWorkflow", workflow_kwargs=kwargs
        )
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) for r in rows)
    # two answers per episode, every episode of both steps: the stats_tracker's num_turns
    assert [r["areal/rollout/num_turns"] for r in rows] == [2.0, 2.0]
    assert len(calls) >= 2 * 4 * 2 * 2  # steps x records x samples x turns


class AskTwice(RolloutWorkflow):
    """AReaL's multi-turn math example's shape: ask, retry once, discount, export concat."""

    def __init__(self, gconfig, tokenizer) -> None:  # type: ignore[no-untyped-def]
        self.gconfig, self.tokenizer = gconfig.new(n_samples=1), tokenizer

    async def arun_episode(self, engine, data):  # type: ignore[no-untyped-def]
        client = ArealOpenAI(engine=engine, tokenizer=self.tokenizer, chat_template_type="concat")
        messages = list(data["messages"])
        for turn in range(2):
            c = await client.chat.completions.create(
                messages=messages, **self.gconfig.to_openai_args_dict()
            )
            client.set_reward(c.id, float(turn))
            messages += [c.choices[0].message, {"role": "user", "content": "Again."}]
        client.apply_reward_discount(turn_discount=0.9)
        return client.export_interactions(style="concat")


def test_an_areal_openai_workflow_trains(tmp_path):
    config, train = _config(tmp_path)
    tok = load_hf_tokenizer(config.tokenizer_path)
    with PPOTrainer(config, train_dataset=train) as trainer:
        trainer.train(workflow=AskTwice(config.gconfig, tok))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/loss"]) for r in rows)
    assert [r["reward/mean"] for r in rows] == [1.0, 1.0]  # the last turn's reward, undiscounted
