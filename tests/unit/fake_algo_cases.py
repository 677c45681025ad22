"""Run by tests/unit/test_fake_device.py in a process of its own. Every ``algo/`` function on a
fake accelerator (tests/support/fake_device.py): inputs live on
the fake device, so a tensor the code makes on the CPU and mixes in raises
``FakeTensorDeviceMismatchError``, and every output must come back on the inputs' device.
Values are not computed (fake tensors have none); the CPU tests check the numbers."""

from __future__ import annotations

import itertools

import pytest
import torch
from fake_device import HostReads, assert_on, fake_device

from areal_m2po.algo import (
    advantages,
    aggregation,
    bradley_terry,
    cispo_loss,
    critic_loss,
    distill,
    dpo,
    kl,
    logprobs,
    m2po,
    normalization,
    policy_ratio,
    ppo_loss,
    reductions,
    rejection_sampling,
    reward_shaping,
    sapo_loss,
    sft_loss,
)
from areal_m2po.algo.options import (
    ADV_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    REJECTION_ACTIONS,
    REJECTION_AGGS,
    REJECTION_METRICS,
)
from areal_m2po.areal.utils.functional import functional as areal_compat

B, T = 4, 6  # two groups of two rows

DATA_DEPENDENT = {
    "m2po.m2po_keep_mask / m2po_mask": "sort the valid tokens' m2: x[loss_mask] has a "
    "data-dependent length, and an empty selection returns early",
    "advantages.gae_advantages": "loops over the columns holding a loss token (nonzero)",
    "logp_mismatch.mismatch_partials": "x[mask] and its emptiness decide the max",
    "trainer/rollout_stats.filter_groups": "keeps the nonzero() groups, or the first if none",
}
"""Functions fake tensors cannot run (a data-dependent shape guards control flow); their tensor
construction is checked statically by tests/unit/test_device_static.py and their values by
their CPU tests."""


@pytest.fixture
def dev(monkeypatch):
    with fake_device(monkeypatch, HostReads()) as device:
        yield device


def _f(device, *shape):
    return torch.zeros(*shape, device=device)


def _mask(device, *shape):
    return torch.ones(*shape, dtype=torch.bool, device=device)


def test_m2po_per_token_region_and_stats(dev):
    """M2PO's per-token m2, trust-region tokens and statistics (the mask itself selects the
    valid tokens, a data-dependent shape: see DATA_DEPENDENT)."""
    behave, prox, mask, adv = _f(dev, B, T), _f(dev, B, T), _mask(dev, B, T), _f(dev, B, T)
    m2 = m2po.m2_per_token(behave, prox, mask)
    assert_on(dev, m2)
    region = m2po.trust_region_tokens(behave, prox, adv, mask)
    assert_on(dev, region)
    assert_on(dev, m2po.m2po_stats(m2, mask, mask, 0.04, in_region=region))


@pytest.mark.parametrize("agg,level", itertools.product(LOSS_AGG_MODES, IMPORTANCE_SAMPLING_LEVELS))
def test_ppo_loss_every_mode(dev, agg, level):
    spec = ppo_loss.PPOLossSpec(
        eps_clip=0.2, c_clip=3.0, importance_sampling_level=level, loss_agg_mode=agg
    )
    x = _f(dev, B, T)
    out = ppo_loss.ppo_actor_loss(x, x, x, x, _mask(dev, B, T), spec, _mask(dev, B, T))
    assert_on(dev, out)
    assert_on(dev, ppo_loss.ppo_token_terms(x, x, x, x, _mask(dev, B, T), spec, None))
    assert_on(dev, ppo_loss.clipped_pg(x, x, 0.2, 0.3, 3.0))


@pytest.mark.parametrize(
    "action,metric,agg,level",
    [
        combo
        for combo in itertools.product(
            REJECTION_ACTIONS, REJECTION_METRICS, REJECTION_AGGS, IMPORTANCE_SAMPLING_LEVELS
        )
        if combo[0] != "clamp" or combo[1] == "ratio"  # clamp is defined for the ratio only
    ],
)
def test_decoupled_loss_with_rejection_sampling(dev, action, metric, agg, level):
    rs = {"level": level, "action": action, "metric": metric, "agg": agg, "upper": 2.0}
    rs["lower"] = 0.5 if metric == "ratio" else None
    spec = ppo_loss.PPOLossSpec(eps_clip=0.2, rejection_sampling=rs)
    x = _f(dev, B, T)
    assert_on(dev, ppo_loss.ppo_actor_loss(x, x, x, x, _mask(dev, B, T), spec, None))


def test_policy_ratio_and_behaviour_weight(dev):
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    for level in IMPORTANCE_SAMPLING_LEVELS:
        assert_on(dev, policy_ratio.policy_ratio(x, x, x, mask, mask, level))
    rs = rejection_sampling.as_rejection_sampling({"upper": 2.0})
    assert_on(dev, rejection_sampling.behaviour_weight(rs, x, x, mask, mask))


@pytest.mark.parametrize("agg", LOSS_AGG_MODES)
def test_sapo_and_cispo(dev, agg):
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    for level in IMPORTANCE_SAMPLING_LEVELS:
        out = sapo_loss.sapo_loss(
            x, x, x, 1.0, 1.05, mask, mask, agg, importance_sampling_level=level
        )
        assert_on(dev, out)
    assert_on(dev, sapo_loss.sapo_gate(x, torch.full((B, T), 1.0, device=dev)))
    spec = ppo_loss.PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.3, loss_agg_mode=agg)
    assert_on(dev, cispo_loss.cispo_loss(x, x, x, x, mask, spec, mask))


def test_critic_sft_kl_and_distill(dev):
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    for loss_type in ("mse", "huber"):
        assert_on(dev, critic_loss.ppo_critic_loss(x, x, x, 0.2, mask, loss_fn_type=loss_type))
    assert_on(dev, sft_loss.sft_nll_loss(x, mask))
    for est in KL_ESTIMATORS:
        assert_on(dev, kl.kl_estimate(x, x, est, clamp=10.0))
    assert_on(dev, distill.reverse_kl_advantages(x, x, mask))
    assert_on(dev, distill.mix_advantages(x, x, mask, 1.0, 0.5))
    assert_on(dev, distill.reverse_kl_sums(x, x, mask))


def test_dpo_and_bradley_terry(dev):
    x, mask = _f(dev, 2 * B, T), _mask(dev, 2 * B, T)
    chosen, rejected = dpo.dpo_pair_logratios(x, x, mask)
    assert_on(dev, (chosen, rejected))
    for loss_type in ("sigmoid", "ipo"):
        assert_on(dev, dpo.dpo_preference_loss(chosen - rejected, beta=0.1, loss_type=loss_type))
    assert_on(dev, dpo.dpo_reward_stats(chosen, rejected, 0.1))
    assert_on(dev, dpo.pair_sequence_logps(x, mask, True))
    r = _f(dev, B)
    assert_on(
        dev, bradley_terry.bradley_terry_loss(r, r, margin=r, center_rewards_coefficient=0.01)
    )
    assert_on(dev, bradley_terry.preference_stats(r, r))
    attn = torch.ones(B, T, dtype=torch.long, device=dev)
    assert_on(dev, bradley_terry.pool_last_token(_f(dev, B, T), attn))


@pytest.mark.parametrize("name", [n for n in ADV_ESTIMATORS if n != "gae"])
def test_advantage_estimators(dev, name):
    mask = _mask(dev, B, T)
    inputs = advantages.AdvantageInputs(
        scores=_f(dev, B),
        loss_mask=mask,
        group_size=2,
        token_rewards=_f(dev, B, T) if name == "gae" else None,
        values=_f(dev, B, T) if name == "gae" else None,
    )
    adv, returns = advantages.builtin_estimator(name)(inputs)
    assert_on(dev, adv if returns is None else (adv, returns))


def test_normalisation_reductions_and_shaping(dev):
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    for mean_level, std_level in itertools.product(("batch", "group", None), repeat=2):
        out = normalization.masked_normalize(x, mask, mean_level, std_level, group_size=2)
        assert_on(dev, out)
        assert_on(dev, normalization.group_normalize(_f(dev, B), mean_level, std_level, 2))
    assert_on(dev, reductions.masked_mean(x, mask))
    assert_on(dev, reductions.masked_sum(x, mask, dim=1))
    assert_on(dev, reductions.masked_var(x, mask))
    assert_on(dev, reductions.stat_scalar(2.0, dev))
    assert_on(dev, aggregation.agg_loss_weight(mask, "seq-mean-token-mean"))
    r = _f(dev, B)
    assert_on(dev, reward_shaping.reward_transform(r, 2.0, 0.5, 1.0))
    lengths = torch.full((B,), 3, dtype=torch.long, device=dev)
    assert_on(dev, reward_shaping.overlong_reward_penalty(r, lengths, 2, 1.0, 5))


def test_logprobs_and_entropy(dev):
    logits = _f(dev, B, T, 11)
    labels = torch.zeros(B, T, dtype=torch.long, device=dev)
    assert_on(dev, logprobs.gather_logprobs_entropy(logits, labels, 0.7, 2, True))


def test_areal_compat_losses(dev):
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    assert_on(dev, areal_compat.ppo_actor_loss_fn(x, x, x, x, 0.2, mask, c_clip=3.0))
    assert_on(dev, areal_compat.sapo_loss_fn(x, x, x, 1.0, 1.05, mask))
    assert_on(dev, areal_compat.cispo_loss_fn(x, x, x, 0.2, mask, eps_clip_higher=0.3))
    assert_on(dev, areal_compat.ppo_critic_loss_fn(x, x, x, 0.2, mask))
    assert_on(dev, areal_compat.dpo_preference_loss(_f(dev, B), beta=0.1))


def test_a_planted_cpu_tensor_in_the_maths_raises(dev, monkeypatch):
    """The harness fails on a CPU-made tensor: one mixed into the clipped objective raises
    as a GPU would."""
    from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError

    clipped = ppo_loss.clipped_pg

    def planted(ratio, *args):
        out = clipped(ratio, *args)
        return (out[0] + torch.zeros(ratio.shape), *out[1:])  # the CPU tensor

    monkeypatch.setattr(ppo_loss, "clipped_pg", planted)
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    with pytest.raises(FakeTensorDeviceMismatchError):
        ppo_loss.ppo_actor_loss(x, x, x, x, mask, ppo_loss.PPOLossSpec(eps_clip=0.2), None)


def test_a_planted_cpu_statistic_is_caught(dev, monkeypatch):
    """... and a statistic left on the CPU (no maths to refuse it) fails the device check."""
    monkeypatch.setattr(
        ppo_loss, "stat_scalar", lambda v, device: torch.tensor(float(v), dtype=torch.float32)
    )
    x, mask = _f(dev, B, T), _mask(dev, B, T)
    out = ppo_loss.ppo_actor_loss(x, x, x, x, mask, ppo_loss.PPOLossSpec(eps_clip=0.2), None)
    with pytest.raises(AssertionError, match="tensors off the device"):
        assert_on(dev, out)
