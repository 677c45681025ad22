"""The keys added with AReaL's meaning: the cadence of evaluation/saves/checkpoints
(freq_steps/freq_epochs/freq_secs), gconfig.max_tokens, actor.disable_dropout,
data_parallel_size, the ref section's kernel and micro-batches, consumer_batch_size and
queue_size."""

from __future__ import annotations

import pytest
import torch

from areal_m2po.api.cli_args import (
    ActorConfig,
    ConfigError,
    DatasetConfig,
    EvaluatorConfig,
    GenerationConfig,
    MicroBatchSpec,
    PPOConfig,
    RecoverConfig,
    RefConfig,
    RolloutConfig,
    SaverConfig,
)
from areal_m2po.api.engine_api import ModelRequest, SamplingParams
from areal_m2po.engine.builtin_models import build_tiny_llama
from areal_m2po.engine.dropout import disable_dropout
from areal_m2po.trainer.cadence import Cadence
from areal_m2po.trainer.preflight import check_engine_launch

# ---------------------------------------------------------------------------------------------
# cadence
# ---------------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cadence_by_steps_epochs_and_time():
    clock = _Clock()
    every = Cadence(SaverConfig(freq_steps=3, freq_epochs=2), clock)
    # 5 steps per epoch: every 3rd step, and after steps 10, 20 (every 2nd epoch)
    due = [s for s in range(1, 21) if every.due_by_count(s, steps_per_epoch=5)]
    assert due == [3, 6, 9, 10, 12, 15, 18, 20]
    timed = Cadence(EvaluatorConfig(freq_steps=None, freq_secs=60.0), clock)
    assert not timed.due_by_count(7, 5) and not timed.due_by_time()
    clock.now += 59.9
    assert not timed.due_by_time()
    clock.now += 0.1
    assert timed.due_by_time()
    timed.ran()  # the time counts from the last run
    assert not timed.due_by_time()
    clock.now += 60
    assert timed.due_by_time()
    never = Cadence(RecoverConfig(freq_steps=None), clock)
    clock.now += 1e6
    assert not any(never.due_by_count(s, 5) for s in range(1, 50)) and not never.due_by_time()


@pytest.mark.parametrize(
    "section, kwargs, key",
    [
        (SaverConfig, {"freq_epochs": 0}, "freq_epochs"),
        (EvaluatorConfig, {"freq_secs": 0.0}, "freq_secs"),
        (RecoverConfig, {"freq_epochs": 1.5}, "freq_epochs"),
    ],
)
def test_cadence_keys_are_checked(section, kwargs, key):
    with pytest.raises(ConfigError) as err:
        section(**kwargs)
    assert err.value.key == key


# ---------------------------------------------------------------------------------------------
# gconfig.max_tokens
# ---------------------------------------------------------------------------------------------


def test_max_tokens_caps_each_request_to_what_its_context_leaves():
    s = SamplingParams.from_gconfig(GenerationConfig(max_new_tokens=8, max_tokens=10))
    assert s.max_tokens == 10
    assert ModelRequest([1] * 5, s).sampling.max_new_tokens == 5  # 10 - 5
    assert ModelRequest([1] * 2, s).sampling.max_new_tokens == 8  # the cap does not bind
    assert ModelRequest([1] * 9, s).sampling.max_new_tokens == 1
    with pytest.raises(ValueError, match="leaves no room to generate under max_tokens=10"):
        ModelRequest([1] * 10, s)
    low = SamplingParams(max_new_tokens=8, min_new_tokens=6, max_tokens=10)
    assert ModelRequest([1] * 7, low).sampling.min_new_tokens == 3
    assert SamplingParams.from_gconfig(GenerationConfig()).max_tokens is None
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_new_tokens=4, max_tokens=1)


def test_max_tokens_must_leave_every_prompt_room():
    with pytest.raises(ConfigError, match="^gconfig.max_tokens: must exceed"):
        PPOConfig(
            gconfig=GenerationConfig(max_tokens=100),
            train_dataset=DatasetConfig(max_prompt_length=100),
        )
    PPOConfig(
        gconfig=GenerationConfig(max_tokens=101), train_dataset=DatasetConfig(max_prompt_length=100)
    )


# ---------------------------------------------------------------------------------------------
# disable_dropout
# ---------------------------------------------------------------------------------------------


def test_disable_dropout_makes_training_forwards_deterministic():
    torch.manual_seed(0)
    model = build_tiny_llama(vocab_size=32, seed=0, attention_dropout=0.5)
    x = torch.randint(0, 32, (2, 12))
    model.train()
    a, b = model(x).logits, model(x).logits
    assert not torch.allclose(a, b)  # dropout is on
    assert disable_dropout(model) >= 1
    assert model.config.attention_dropout == 0.0
    model.train()
    c = model(x).logits
    model.eval()
    torch.testing.assert_close(c, model(x).logits)
    assert disable_dropout(model) == 0  # nothing left to turn off
    assert ActorConfig(disable_dropout=True).disable_dropout
    with pytest.raises(ConfigError, match="disable_dropout: must be true or false"):
        ActorConfig(disable_dropout=1)


# ---------------------------------------------------------------------------------------------
# data_parallel_size, ref, consumer_batch_size, queue_size
# ---------------------------------------------------------------------------------------------


def test_data_parallel_size_must_match_the_launch():
    engine = ActorConfig(data_parallel_size=4)
    with pytest.raises(ConfigError, match="has 1 process\\(es\\) but 4 data-parallel") as err:
        check_engine_launch([("actor", engine)], "NO", 1, False, "no")
    assert err.value.key == "actor.data_parallel_size"
    check_engine_launch([("actor", ActorConfig(data_parallel_size=1))], "NO", 1, False, "no")
    check_engine_launch([("actor", ActorConfig())], "NO", 1, False, "no")
    with pytest.raises(ConfigError, match="data_parallel_size"):
        ActorConfig(data_parallel_size=0)


def test_ref_engine_takes_its_own_kernel_and_micro_batches_or_the_actors():
    actor = ActorConfig(
        path="builtin:tiny", attn_implementation="eager", mb_spec=MicroBatchSpec(n_mbs=2)
    )
    plain = RefConfig().engine_config(actor)
    assert (plain.path, plain.attn_implementation, plain.mb_spec) == (
        "builtin:tiny", "eager", actor.mb_spec,
    )  # fmt: skip
    own = RefConfig(
        path="other", attn_implementation="sdpa", mb_spec=MicroBatchSpec(max_tokens_per_mb=64)
    ).engine_config(actor)
    assert (own.path, own.attn_implementation, own.mb_spec.max_tokens_per_mb) == (
        "other", "sdpa", 64,
    )  # fmt: skip
    assert own.backend == actor.backend


def test_consumer_batch_size_and_queue_size_against_the_batch():
    batch = DatasetConfig(batch_size=4)
    PPOConfig(train_dataset=batch, rollout=RolloutConfig(consumer_batch_size=4))
    with pytest.raises(ConfigError, match="set it to 4 or null, got 3"):
        PPOConfig(train_dataset=batch, rollout=RolloutConfig(consumer_batch_size=3))
    # max_head_offpolicyness 2: up to (2 + 1) x 4 = 12 groups ahead of the trainer
    roll = dict(mode="async", staleness=0, max_head_offpolicyness=2)
    PPOConfig(train_dataset=batch, rollout=RolloutConfig(queue_size=12, **roll))
    with pytest.raises(ConfigError, match="= 12 groups ahead"):
        PPOConfig(train_dataset=batch, rollout=RolloutConfig(queue_size=11, **roll))
