"""Where this trainer and AReaL could differ (docs/areal_parity.md): each switch, by hand.

Every expected number is derived in the comments. Each test checks the setting that gives
AReaL's behaviour and, where our default differs, our default too.
"""

from __future__ import annotations

import math

import pytest
import torch
from batches import reward_batch

from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss
from areal_m2po.api.cli_args import ActorConfig, ConfigError, RejectionSamplingConfig
from areal_m2po.areal.utils.functional import ppo_actor_loss_fn, sapo_loss_fn
from areal_m2po.trainer.ppo.actor import PPOActor

F64 = torch.float64


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=F64)


# ---------------------------------------------------------------------------------------
# Decoupled loss without rejection sampling: the behaviour weight
# ---------------------------------------------------------------------------------------


def _decoupled_loss(**actor_kwargs: object) -> float:
    """One token: prox - behave = log 0.5 (w = 0.5), lp - prox = log 1.1 (r = 1.1), A = 2."""
    cfg = ActorConfig(use_decoupled_loss=True, adv_norm=None, **actor_kwargs)
    actor = PPOActor(cfg, engine=None, group_size=1, max_new_tokens=4)  # type: ignore[arg-type]
    prox = _t([math.log(0.5)])
    mb = {
        "loss_mask": torch.tensor([[True]]),
        "behave_logp": _t([0.0]),
        "prox_logp": prox,
        "advantages": _t([2.0]),
    }
    lp = (prox + math.log(1.1)).requires_grad_(True)
    loss, _ = actor._microbatch_loss(lp, torch.zeros_like(lp), mb, step_in_update=0)
    return float(loss.detach())


def test_decoupled_behaviour_weight_default_and_areal_setting():
    # default: loss = -A r w = -2 * 1.1 * 0.5 = -1.1
    assert _decoupled_loss() == pytest.approx(-1.1)
    # AReaL (rejection_sampling null): no weight, loss = -A r = -2.2
    assert _decoupled_loss(use_behave_imp_weight=False) == pytest.approx(-2.2)
    # with rejection sampling (clamp w to [0.8, 2]) the bounded weight applies: -2*1.1*0.8
    rs = RejectionSamplingConfig(action="clamp", lower=0.8, upper=2.0)
    assert _decoupled_loss(rejection_sampling=rs) == pytest.approx(-1.76)


def test_behaviour_weight_switch_rejects_rejection_sampling_without_weight():
    with pytest.raises(ConfigError, match="use_behave_imp_weight"):
        ActorConfig(
            use_decoupled_loss=True,
            use_behave_imp_weight=False,
            rejection_sampling=RejectionSamplingConfig(),
        )


# ---------------------------------------------------------------------------------------
# GSPO with token-level behaviour weights and token-level advantages
# ---------------------------------------------------------------------------------------


def test_gspo_gradient_with_token_behaviour_weights_matches_areal():
    # one row of 2 tokens, lp = prox = 0 (sequence ratio r = 1, unclipped), behaviour weights
    # w = [1, 3] (old = prox - log w), advantages A = [1, 3] -> mean advantage 2.
    # AReaL (the weight applied through rejection sampling, clamp at a bound never reached):
    # loss = (1/2) sum_t -A_mean r w_t = (1/2)(-2 - 6) = -4, and r = exp(mean lp - prox)
    # gives d r / d lp_t = r / 2, so d loss / d lp_t = (1/2) sum_t' -A_mean w_t' / 2 = -2 for
    # both tokens. (Per-token GSPO-token gradient would be -A_t w_t / 2 = [-0.5, -4.5].)
    # Here the decoupled loss applies the same uncapped weight without rejection sampling.
    prox = _t([0.0, 0.0])
    old = prox - torch.log(_t([1.0, 3.0]))
    mask = torch.tensor([[True, True]])
    rs = {"action": "clamp", "upper": 100.0}
    for call in ("areal", "here"):
        lp = _t([0.0, 0.0]).requires_grad_(True)
        if call == "areal":
            loss, _ = ppo_actor_loss_fn(
                lp, prox, old, _t([1.0, 3.0]), 0.5, mask, rejection_sampling=rs,
                importance_sampling_level="sequence",
            )  # fmt: skip
        else:
            spec = PPOLossSpec(eps_clip=0.5, importance_sampling_level="sequence")
            loss, _ = ppo_actor_loss(lp, prox, old, _t([1.0, 3.0]), mask, spec)
        loss.backward()
        assert loss.item() == pytest.approx(-4.0), call
        assert torch.allclose(lp.grad, _t([-2.0, -2.0])), call


def test_gspo_sapo_averages_advantages_per_sequence():
    # SAPO at r = 1 (tau 1): token loss -A (4/tau) sigmoid(tau (r - 1)), d/dr = -A at r = 1.
    # Sequence level: A_mean = 2, d r / d lp_t = 1/2, so d loss / d lp_t =
    # (1/2) sum_t' (-2)(1/2) = -1 for both tokens (per-token: -A_t / 2 = [-0.5, -1.5]).
    lp = _t([0.0, 0.0]).requires_grad_(True)
    mask = torch.tensor([[True, True]])
    loss, _ = sapo_loss_fn(
        lp, _t([0.0, 0.0]), _t([1.0, 3.0]), 1.0, 1.0, mask, importance_sampling_level="sequence"
    )
    loss.backward()
    # loss = (1/2) sum_t -2 * 4 * sigmoid(0) = -4
    assert loss.item() == pytest.approx(-4.0)
    assert torch.allclose(lp.grad, _t([-1.0, -1.0]))


def test_gspo_sequence_statistics_use_only_kept_tokens():
    # M2PO drops token 2 of the row: the sequence ratio and mean advantage come from token 1
    # alone (r = exp(log 1.2) = 1.2, A_mean = 1): loss = -1 * 1.2 / 2 valid tokens = -0.6
    lp = _t([math.log(1.2), 5.0]).requires_grad_(True)
    z = _t([0.0, 0.0])
    mask = torch.tensor([[True, True]])
    keep = torch.tensor([[True, False]])
    spec = PPOLossSpec(eps_clip=0.5, importance_sampling_level="sequence")
    loss, _ = ppo_actor_loss(lp, z, z, _t([1.0, 7.0]), mask, spec, m2po_mask=keep)
    loss.backward()
    assert loss.item() == pytest.approx(-0.6)
    assert torch.allclose(lp.grad, _t([-0.6, 0.0]))


# ---------------------------------------------------------------------------------------
# Advantages and rewards (PPOActor.compute_advantages)
# ---------------------------------------------------------------------------------------


def _batch(lengths: list[int], rewards: list[float], no_eos: list[bool], width: int) -> dict:
    return reward_batch(rewards, lengths, width, no_eos)


def _advantages(batch: dict, group_size: int, max_new_tokens: int, **actor_kwargs) -> dict:
    cfg = ActorConfig(**actor_kwargs)
    actor = PPOActor(cfg, engine=None, group_size=group_size, max_new_tokens=max_new_tokens)  # type: ignore[arg-type]
    stats = actor.compute_advantages(batch)
    return {**batch, "stats": stats}


def test_grpo_group_statistics_per_sequence_and_token_weighted():
    # one group: scores [1, 0, 0, 0], lengths [2, 10, 10, 10] (32 tokens)
    lengths, rewards = [2, 10, 10, 10], [1.0, 0.0, 0.0, 0.0]
    # per sequence (default): mean 1/4, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5,
    # advantages (x - 0.25) / (0.5 + 1e-5) = [1.5, -0.5, -0.5, -0.5]
    out = _advantages(_batch(lengths, rewards, [False] * 4, 10), 4, 10)
    first = out["advantages"][:, 0]
    assert torch.allclose(first, torch.tensor([1.5, -0.5, -0.5, -0.5]), atol=1e-4)
    # token-weighted (AReaL): mean 2/32 = 1/16; sum of squared deviations
    # 2 (15/16)^2 + 30 (1/16)^2 = 1.875, unbiased std sqrt(1.875 / 31) = 0.24593;
    # advantages (15/16) / 0.24593 = 3.81 and -(1/16) / 0.24593 = -0.25
    out = _advantages(_batch(lengths, rewards, [False] * 4, 10), 4, 10, adv_norm_weighting="token")
    std = math.sqrt(1.875 / 31) + 1e-5
    expected = torch.tensor([15 / 16 / std, -1 / 16 / std, -1 / 16 / std, -1 / 16 / std])
    assert torch.allclose(out["advantages"][:, 0], expected, atol=1e-5)
    assert [round(v, 2) for v in out["advantages"][:, 0].tolist()] == [3.81, -0.25, -0.25, -0.25]
    # every valid token of a row carries the row's advantage, padding 0
    assert torch.equal(out["advantages"] != 0, out["loss_mask"])


def test_overlong_penalty_before_reward_scaling_and_clip():
    # length 10 = max_new_tokens, window 4, factor 1: penalty -(10 - 6) / 4 * 1 = -1 on the raw
    # reward 1 -> 0, then (0 + 0) * 2 clipped to 1.5 -> 0. (Penalty after scaling and clipping
    # would give clip(2, 1.5) - 1 = 0.5.)
    out = _advantages(
        _batch([10], [1.0], [True], 10),
        1,
        10,
        adv_norm=None,
        reward_scaling=2.0,
        reward_clip=1.5,
        overlong_reward_penalty=True,
        overlong_tokens=4,
        overlong_penalty_factor=1.0,
    )
    assert torch.allclose(out["advantages"], torch.zeros(1, 10))
    # length 8: penalty -0.5 -> (1 - 0.5) * 2 = 1.0 (inside the clip)
    out = _advantages(
        _batch([8], [1.0], [False], 10),
        1,
        10,
        adv_norm=None,
        reward_scaling=2.0,
        reward_clip=1.5,
        overlong_reward_penalty=True,
        overlong_tokens=4,
        overlong_penalty_factor=1.0,
    )
    assert out["advantages"][0, :8].tolist() == pytest.approx([1.0] * 8)


def _kl_batch() -> dict:
    # one token: proximal - ref = 15 (k1 = 15), behaviour - ref = 2
    batch = _batch([1], [0.0], [False], 1)
    batch["prox_logp"] = torch.tensor([[15.0]])
    batch["behave_logp"] = torch.tensor([[2.0]])
    batch["ref_logp"] = torch.zeros(1, 1)
    return batch


def test_kl_reward_clamped_to_ten_like_areal():
    # k1 = 15 clamped to 10; token reward -0.1 * 10 = -1, GAE (gamma = lambda = 1, no critic)
    # gives advantage -1 (without the clamp: -1.5)
    out = _advantages(_kl_batch(), 1, 1, adv_norm=None, kl_ctl=0.1)
    assert out["advantages"].item() == pytest.approx(-1.0)
    assert out["stats"]["actor/kl_ref"] == pytest.approx(10.0)


def test_kl_reward_from_behaviour_logprobs_switch():
    # kl_logp=behave: k1 = 2 - 0 = 2, advantage -0.2
    out = _advantages(_kl_batch(), 1, 1, adv_norm=None, kl_ctl=0.1, kl_logp="behave")
    assert out["advantages"].item() == pytest.approx(-0.2)


def test_mask_no_eos_with_zero_zeroes_the_score_and_overlong_filtering_drops_the_row():
    # group of 2, both rewards 1, row 1 truncated.
    # mask_no_eos_with_zero (AReaL): scores [1, 0] -> group mean 0.5, unbiased std
    # sqrt(0.5) -> advantages +-0.5 / (0.70711 + 1e-5); row 1 still trains
    out = _advantages(
        _batch([3, 3], [1.0, 1.0], [False, True], 3), 2, 3, mask_no_eos_with_zero=True
    )
    a = 0.5 / (math.sqrt(0.5) + 1e-5)
    assert out["loss_mask"].all()
    assert torch.allclose(out["advantages"], torch.tensor([[a] * 3, [-a] * 3]), atol=1e-6)
    # overlong_filtering: scores [1, 1] -> advantages 0; row 1 out of the loss mask
    out = _advantages(_batch([3, 3], [1.0, 1.0], [False, True], 3), 2, 3, overlong_filtering=True)
    assert out["loss_mask"].tolist() == [[True] * 3, [False] * 3]
    assert torch.equal(out["advantages"], torch.zeros(2, 3))


def test_truncation_keys_refuse_stop_strings():
    from areal_m2po.api.config_loader import load_config

    for key in ("mask_no_eos_with_zero", "overlong_filtering"):
        with pytest.raises(ConfigError, match=f"actor.{key}"):
            load_config([f"actor.{key}=true", "gconfig.stop=[x]"])


def test_kl_estimate_clamp_by_hand_and_validation():
    from areal_m2po.algo.kl import kl_estimate

    lp, ref = _t([15.0, -12.0, 0.5]), _t([0.0, 0.0, 0.0])
    assert kl_estimate(lp, ref, "k1", clamp=10.0).tolist() == [[10.0, -10.0, 0.5]]
    # k2 = d^2 / 2 = [112.5, 72, 0.125] -> [10, 10, 0.125]
    assert kl_estimate(lp, ref, "k2", clamp=10.0).tolist() == [[10.0, 10.0, 0.125]]
    assert kl_estimate(lp, ref, "k1").tolist() == [[15.0, -12.0, 0.5]]
    with pytest.raises(ValueError, match="clamp"):
        kl_estimate(lp, ref, "k1", clamp=0.0)


# ---------------------------------------------------------------------------------------
# Behaviour log-probs vs truncated sampling
# ---------------------------------------------------------------------------------------

_NO_READER = [
    "actor.m2_threshold=null",
    "actor.use_decoupled_loss=false",
    "actor.recompute_logprob=true",
]
_READERS = [
    ("actor.m2_threshold", ["actor.m2_threshold=0.04", "actor.use_decoupled_loss=false"]),
    ("actor.use_decoupled_loss", ["actor.m2_threshold=null", "actor.use_decoupled_loss=true"]),
    (
        "actor.recompute_logprob=false",
        [
            "actor.m2_threshold=null",
            "actor.use_decoupled_loss=false",
            "actor.recompute_logprob=false",
        ],
    ),
    ("actor.kl_logp=behave", [*_NO_READER, "actor.kl_ctl=0.1", "actor.kl_logp=behave"]),
]
_TRUNCATIONS = [
    ("gconfig.top_p", "gconfig.top_p=0.9"),
    ("gconfig.top_k", "gconfig.top_k=5"),
    ("gconfig.min_new_tokens", "gconfig.min_new_tokens=2"),
]


@pytest.mark.parametrize("reader,reader_args", _READERS, ids=[r[0] for r in _READERS])
@pytest.mark.parametrize("key,override", _TRUNCATIONS, ids=[t[0] for t in _TRUNCATIONS])
def test_truncated_sampling_refused_where_behaviour_logprobs_are_read(
    reader, reader_args, key, override
):
    from areal_m2po.api.config_loader import load_config

    with pytest.raises(ConfigError) as err:
        load_config([*reader_args, override])
    assert err.value.key == key
    assert reader in str(err.value)


def test_greedy_refused_where_behaviour_logprobs_are_read():
    from areal_m2po.api.config_loader import load_config

    with pytest.raises(ConfigError, match="gconfig.greedy"):
        load_config(["gconfig.greedy=true", "gconfig.n_samples=1", "actor.adv_norm=null"])


def test_truncated_sampling_allowed_when_only_recomputed_logprobs_are_read():
    from areal_m2po.api.config_loader import load_config

    cfg = load_config(
        [*_NO_READER, "gconfig.top_p=0.9", "gconfig.top_k=5", "gconfig.min_new_tokens=2"]
    )
    assert (cfg.gconfig.top_p, cfg.gconfig.top_k, cfg.gconfig.min_new_tokens) == (0.9, 5, 2)
    # a KL penalty on the proximal log-probs reads no behaviour log-probs either
    load_config([*_NO_READER, "actor.kl_ctl=0.1", "gconfig.top_p=0.9"])


# ---------------------------------------------------------------------------------------
# The std of adv_norm/reward_norm: of the centred values (AReaL's Normalization)
# ---------------------------------------------------------------------------------------


def test_group_mean_batch_std_is_the_pooled_within_group_spread():
    from areal_m2po.algo.normalization import group_normalize, masked_normalize

    # groups [1, 0] and [5, 4]: group means 0.5 and 4.5, centred [0.5, -0.5, 0.5, -0.5];
    # batch std of the centred values sqrt(4 * 0.25 / 3) = sqrt(1/3) -> +-0.5 * sqrt(3)
    # (the std of x itself, sqrt(17 / 3), would give +-0.21)
    x = torch.tensor([1.0, 0.0, 5.0, 4.0], dtype=F64)
    out = group_normalize(x, "group", "batch", group_size=2, eps=0.0)
    h = 0.5 * math.sqrt(3)
    assert out.tolist() == pytest.approx([h, -h, h, -h])
    # token level, one token per row: the same numbers
    tok = masked_normalize(
        x[:, None], torch.ones(4, 1, dtype=torch.bool), "group", "batch", 2, eps=0.0
    )
    assert tok[:, 0].tolist() == pytest.approx([h, -h, h, -h])


def test_leave_one_out_with_std_and_std_without_centring():
    from areal_m2po.algo.normalization import group_normalize

    # RLOO + std, one group [1, 0, 0, 0]: leave-one-out means [0, 1/3, 1/3, 1/3], centred
    # [1, -1/3, -1/3, -1/3], std sqrt((1 + 3/9) / 3) = 2/3 -> [1.5, -0.5, -0.5, -0.5]
    # (the std of x, 0.5, would give [2, -2/3, -2/3, -2/3])
    x = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    out = group_normalize(x, "group", "group", group_size=4, mean_leave1out=True, eps=0.0)
    assert out.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # no centring: [3, 4] over sqrt((9 + 16) / 1) = 5 -> [0.6, 0.8]
    out = group_normalize(torch.tensor([3.0, 4.0], dtype=F64), None, "group", group_size=2, eps=0.0)
    assert out.tolist() == pytest.approx([0.6, 0.8])
