"""The training-inference mismatch in the trainer (rollout/logp_mismatch_*), without vLLM:

* the in-process HF engine declares exact log-probs: on-policy batches reuse them, and the
  check of ``rollout.logp_mismatch_freq`` (sync, staleness 1) finds them equal to the
  trainer's within batching noise, every step;
* an engine without exact log-probs (a scripted one, log-prob -2.0 for every token) gets a
  proximal forward pass even on-policy, and the mismatch is logged over its tokens;
* such an engine without a proximal forward pass is warned about once, naming the key.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from areal_m2po.api.cli_args import ConfigError
from areal_m2po.api.config_loader import load_config

REPO = Path(__file__).resolve().parents[2]

HF_BATCHING_TOL = 1e-4
"""max |behave - trainer| of the HF engine (same code and weights; generate's cached
attention vs one packed forward pass): fp32 batching noise."""


def _config(tmp_path, *overrides):
    return load_config(
        [
            "--config",
            str(REPO / "configs" / "tiny.yaml"),
            f"output_dir={tmp_path / 'run'}",
            "evaluator.eval_at_end=false",
            "saver.save_at_end=false",
            "reward.path=toy_rewards:digit_fraction",
            *overrides,
        ]
    )


def _metrics(tmp_path):
    with open(tmp_path / "run" / "metrics.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _train(trainer):
    try:
        trainer.train()
    finally:
        trainer.close()


def test_the_check_measures_the_hf_engine_every_step_at_staleness_1(tmp_path):
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = _config(tmp_path, "total_train_steps=2", "rollout.logp_mismatch_freq=1")
    trainer = RLTrainer(cfg)
    assert trainer.actor.exact_behave_logp is True
    _train(trainer)
    rows = _metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        print({k: v for k, v in r.items() if k.startswith("rollout/logp_mismatch")})
        assert r["rollout/logp_mismatch_tokens"] > 0
        assert 0 <= r["rollout/logp_mismatch_abs_mean"] <= r["rollout/logp_mismatch_abs_max"]
        assert r["rollout/logp_mismatch_abs_max"] < HF_BATCHING_TOL
        assert 0 <= r["rollout/logp_mismatch_kl"] < HF_BATCHING_TOL**2
        assert r["timing/mismatch_s"] > 0


def test_an_inexact_engine_gets_a_proximal_pass_on_policy_and_its_mismatch_logged(tmp_path):
    from scripted_engine import ScriptedEngine

    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = _config(tmp_path, "total_train_steps=1", "rollout.staleness=0")
    trainer = RLTrainer(cfg)
    tok = trainer.tokenizer
    fake = ScriptedEngine([tok.convert_tokens_to_ids(d) for d in "123"], int(tok.eos_token_id))
    assert fake.exact_logprobs is False
    trainer.rollout.engine = fake
    trainer.actor = trainer._build_actor()  # its plan takes the engine's inexact log-probs
    trainer._check_behaviour_source()
    assert trainer.actor.exact_behave_logp is False
    _train(trainer)
    (row,) = _metrics(tmp_path)
    # 16 completions of 1..4 tokens (4 of each), all of version 0 = the policy's
    assert row["rollout/logp_mismatch_tokens"] == 4 * (1 + 2 + 3 + 4)
    # the fake's -2.0 is far from the tiny model's log-probs: a large mismatch, which the
    # decoupled loss now corrects (the behaviour weight prox/behave is no longer 1)
    assert row["rollout/logp_mismatch_abs_mean"] > 0.1
    assert row["rollout/logp_mismatch_kl"] > 0
    assert row["actor/behave_imp_weight"] != pytest.approx(1.0, abs=1e-3)
    assert row["timing/prox_s"] > 0


def test_an_inexact_engine_without_a_proximal_pass_is_warned_once(tmp_path, caplog):
    from scripted_engine import ScriptedEngine

    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = _config(tmp_path, "total_train_steps=1", "actor.recompute_logprob=false")
    trainer = RLTrainer(cfg)
    try:
        trainer.rollout.engine = ScriptedEngine([1], 2)
        trainer.actor = trainer._build_actor()  # its plan takes the engine's log-probs
        with caplog.at_level(logging.WARNING, logger="areal_m2po.trainer"):
            trainer._check_behaviour_source()
    finally:
        trainer.close()
    (msg,) = [r.getMessage() for r in caplog.records if "logp_mismatch" in r.getMessage()]
    assert msg.startswith("ScriptedEngine's behaviour log-probs are not the trainer's own")
    assert "set actor.recompute_logprob=true" in msg


@pytest.mark.parametrize(
    "overrides", [("rollout.staleness=0",), ("rollout.mode=async", "rollout.staleness=0")]
)
def test_the_check_is_refused_where_the_proximal_pass_measures_it(tmp_path, overrides):
    with pytest.raises(ConfigError, match="rollout.logp_mismatch_freq.*staleness >= 1"):
        _config(tmp_path, "rollout.logp_mismatch_freq=2", *overrides)
