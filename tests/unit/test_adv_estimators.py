"""The advantage-estimator seam (actor.adv_estimator): each built-in against hand-derived
values, the default that reproduces the old choice (grpo without a critic, gae with one or with
a KL penalty), a user estimator by dotted path, and the config's one-line errors."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from batches import prefix_mask, reward_batch

from areal_m2po.algo.advantages import (
    AdvantageInputs,
    builtin_estimator,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from areal_m2po.api.cli_args import ActorConfig, ConfigError, PPOConfig
from areal_m2po.trainer.ppo.actor import PPOActor


def _inputs(scores: list[float], lengths: list[int], group_size: int, **kw) -> AdvantageInputs:
    width = max(lengths)
    return AdvantageInputs(
        torch.tensor(scores, dtype=torch.float32), prefix_mask(lengths, width), group_size, **kw
    )


def test_grpo_is_the_score_per_sequence():
    adv, returns = grpo_advantages(_inputs([1.0, -2.0], [2, 1], 2))
    assert adv.tolist() == [1.0, -2.0] and returns is None
    inp = _inputs([1.0, -2.0], [2, 1], 2, token_rewards=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="^grpo takes one score per sequence"):
        grpo_advantages(inp)


def test_rloo_leave_one_out_baseline_by_hand():
    # group 1: [1, 0, 0, 1], sum 2: A = r - (2 - r) / 3 -> 1 - 1/3, 0 - 2/3
    # group 2: [2, 2, 2, 5], sum 11: A = 2 - 9/3 = -1, 5 - 6/3 = 3
    adv, returns = rloo_advantages(_inputs([1, 0, 0, 1, 2, 2, 2, 5], [1] * 8, 4))
    want = [2 / 3, -2 / 3, -2 / 3, 2 / 3, -1.0, -1.0, -1.0, 3.0]
    assert adv.dtype == torch.float32 and returns is None
    assert adv.tolist() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match=r"^rloo: group_size must be an int >= 2, got 1$"):
        rloo_advantages(_inputs([1.0, 0.0], [1, 1], 1))
    with pytest.raises(ValueError, match="^rloo: 3 rows do not form groups of 2$"):
        rloo_advantages(_inputs([1.0, 0.0, 1.0], [1, 1, 1], 2))


def _reinforce_pp_by_hand() -> list[list[float]]:
    # scores [1, 0 | 3, 3], groups of 2 -> centred [0.5, -0.5 | 0, 0]; row lengths [2, 1, 1, 2]
    # tokens: 0.5, 0.5, -0.5, 0, 0, 0 (N = 6): mean 1/12; deviations 5/12 (x2), -7/12, -1/12
    # (x3); unbiased variance (2*25 + 49 + 3) / 144 / 5; adv = deviation / sqrt(var + 1e-8)
    sd = math.sqrt(102 / 144 / 5 + 1e-8)
    return [
        [5 / 12 / sd, 5 / 12 / sd],
        [-7 / 12 / sd, 0.0],
        [-1 / 12 / sd, 0.0],
        [-1 / 12 / sd] * 2,
    ]


def test_reinforce_pp_baseline_then_batch_whitening_by_hand():
    adv, returns = reinforce_pp_advantages(_inputs([1.0, 0.0, 3.0, 3.0], [2, 1, 1, 2], 2))
    assert returns is None and adv.shape == (4, 2)
    for got, want in zip(adv.tolist(), _reinforce_pp_by_hand(), strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    # a group of one keeps its score (baseline 0), then the batch whitening
    solo, _ = reinforce_pp_advantages(_inputs([2.0, 0.0], [1, 1], 1))
    assert solo[:, 0].tolist() == pytest.approx([1 / math.sqrt(2 + 1e-8), -1 / math.sqrt(2 + 1e-8)])


def test_reinforce_pp_whitens_over_all_ranks_with_batch_sum():
    """Two shards whose batch_sum adds both (a fake all-reduce in two threads) give the slices
    of the whole batch's result."""
    barrier, box = threading.Barrier(2), [None, None]
    lock = threading.Lock()
    out: dict[int, torch.Tensor] = {}

    def all_reduce(rank: int):
        def reduce(t: torch.Tensor) -> torch.Tensor:
            box[rank] = t
            barrier.wait()
            total = box[0] + box[1]
            barrier.wait()
            return total

        return reduce

    def run(rank: int, scores: list[float], lengths: list[int]) -> None:
        inp = _inputs(scores, lengths, 2, batch_sum=all_reduce(rank))
        adv, _ = reinforce_pp_advantages(
            AdvantageInputs(inp.scores, prefix_mask(lengths, 2), 2, batch_sum=inp.batch_sum)
        )
        with lock:
            out[rank] = adv

    threads = [
        threading.Thread(target=run, args=(0, [1.0, 0.0], [2, 1])),
        threading.Thread(target=run, args=(1, [3.0, 3.0], [1, 2])),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = torch.cat([out[0], out[1]]).tolist()
    for row, want in zip(got, _reinforce_pp_by_hand(), strict=True):
        assert row == pytest.approx(want, abs=1e-6)


def test_gae_builtin_by_hand():
    gae = builtin_estimator("gae")
    # one row, two tokens, score 1 on the last; values [0.5, 0.2]; gamma 0.9, lambda 0.8:
    # delta_1 = 1 - 0.2 = 0.8 = A_1; delta_0 = 0.9 * 0.2 - 0.5 = -0.32, A_0 = -0.32 + 0.72 * 0.8
    inp = _inputs([1.0], [2], 1, values=torch.tensor([[0.5, 0.2]]), discount=0.9, gae_lambda=0.8)
    adv, returns = gae(inp)
    assert adv.tolist()[0] == pytest.approx([0.256, 0.8])
    assert returns.tolist()[0] == pytest.approx([0.756, 1.0])
    # the KL penalty -0.1 per token: delta_1 = 0.9 - 0.2 = 0.7, A_0 = -0.42 + 0.72 * 0.7
    kl = AdvantageInputs(**{**inp.__dict__, "token_rewards": torch.tensor([[-0.1, -0.1]])})
    assert gae(kl)[0].tolist()[0] == pytest.approx([0.084, 0.7])
    # no critic, gamma = lambda = 1: every valid token's advantage is the score
    adv, _ = gae(_inputs([2.0, -1.0], [3, 1], 1))
    assert adv.tolist() == [[2.0, 2.0, 2.0], [-1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="^unknown advantage estimator 'ppo'"):
        builtin_estimator("ppo")


def _actor(group_size: int = 2, **kwargs) -> PPOActor:
    has_critic = kwargs.pop("has_critic", False)
    return PPOActor(ActorConfig(**kwargs), None, group_size, 3, has_critic=has_critic)  # type: ignore[arg-type]


def test_actor_default_is_grpo_without_a_critic_and_gae_with_one():
    batch = reward_batch([1.0, 0.0], [2, 3], 3)
    values = torch.tensor([[0.5, 0.5, 0.0], [0.25, 0.25, 0.25]])
    # no critic: GRPO (the score on every valid token), values in the batch are not read
    out = {**batch, "values": values}
    _actor(adv_norm=None).compute_advantages(out)
    assert out["advantages"].tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    # with a critic: GAE (gamma = lambda = 1: A_t = score - V_t on valid tokens)
    out = {**batch, "values": values}
    _actor(adv_norm=None, has_critic=True).compute_advantages(out)
    assert out["advantages"].tolist() == [[0.5, 0.5, 0.0], [-0.25, -0.25, -0.25]]
    assert out["returns"].tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    with pytest.raises(KeyError, match="has no 'values'"):
        _actor(adv_norm=None, has_critic=True).compute_advantages(dict(batch))


def test_actor_rloo_and_a_user_estimator(tmp_path, monkeypatch):
    out = reward_batch([1.0, 0.0, 0.0, 1.0], [1, 2, 1, 1], 3)
    _actor(4, adv_estimator="rloo", adv_norm=None).compute_advantages(out)
    assert out["advantages"][:, 0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert out["advantages"][1].tolist() == pytest.approx([-2 / 3, -2 / 3, 0.0])
    (tmp_path / "my_adv.py").write_text(
        "def doubled(inputs):\n    return 2 * inputs.scores, None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = reward_batch([1.0, 3.0], [1, 2], 3)
    _actor(adv_estimator="my_adv:doubled", adv_norm=None).compute_advantages(out)
    assert out["advantages"].tolist() == [[2.0, 0.0, 0.0], [6.0, 6.0, 0.0]]
    with pytest.raises(ConfigError, match="^actor.adv_estimator: .*my_adv"):
        _actor(adv_estimator="my_adv:halved")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["actor.adv_estimator=grpo", "critic.enabled=true", "actor.adv_norm.mean_level=batch"],
            "^actor.adv_estimator: grpo ignores the critic",
        ),
        (
            ["actor.adv_estimator=rloo", "actor.kl_ctl=0.1"],
            "^actor.adv_estimator: rloo takes one score per sequence",
        ),
        (["actor.adv_estimator=reinforce_pp"], "^actor.adv_estimator: reinforce_pp brings its own"),
        (
            ["actor.adv_estimator=rloo", "actor.adv_norm=null", "gconfig.n_samples=1"],
            "^actor.adv_estimator: rloo needs gconfig.n_samples >= 2",
        ),
        (["actor.adv_estimator=ppo"], "^actor.adv_estimator: 'ppo' is neither a built-in"),
    ],
)
def test_config_refuses_contradicting_estimators(overrides, message):
    from areal_m2po.api.config_loader import load_config

    with pytest.raises(ConfigError, match=message) as err:
        load_config(overrides)
    assert "\n" not in str(err.value)
    assert isinstance(load_config(["actor.adv_estimator=gae"]), PPOConfig)
