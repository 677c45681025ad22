"""The policy losses as named modes (algo/policy_loss.py): each mode on one or two tokens
against the number worked out by hand, the registry's shared signature, an unknown mode."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.policy_loss import (
    MODES,
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOptions,
    policy_loss,
)
from areal_m2po.algo.ppo_loss import PPOLossSpec

F64 = torch.float64


def _inputs(log_ratio, adv, behave_gap=None) -> PolicyLossInputs:
    """One row: ``logp - prox = log_ratio`` per token, ``prox - behave = behave_gap``."""
    prox = torch.zeros(1, len(log_ratio), dtype=F64)
    logp = torch.tensor([log_ratio], dtype=F64)
    gap = torch.tensor([behave_gap or [0.0] * len(log_ratio)], dtype=F64)
    adv_t = torch.full_like(prox, float(adv))
    mask = torch.ones(1, len(log_ratio), dtype=torch.bool)
    return PolicyLossInputs(logp, prox, prox - gap, adv_t, mask)


def _loss(mode: str, x: PolicyLossInputs, **spec) -> float:
    return float(policy_loss(mode, x, PolicyLossOptions(ppo=PPOLossSpec(**spec)))[0])


def test_the_modes_and_their_names():
    assert set(POLICY_LOSSES) == {"ppo_clip", "dual_clip", "decoupled", "gspo", "cispo", "sapo"}
    assert (*POLICY_LOSSES, "custom") == MODES


def test_ppo_clip_inside_and_outside_the_band():
    # A = 1: r = e^0.1 inside [0.8, 1.2]: -r; r = e^0.5 beyond 1.2: the clipped -1.2
    assert _loss("ppo_clip", _inputs([0.1], 1.0), eps_clip=0.2) == pytest.approx(-math.exp(0.1))
    assert _loss("ppo_clip", _inputs([0.5], 1.0), eps_clip=0.2) == pytest.approx(-1.2)


def test_dual_clip_bounds_a_negative_advantage():
    # A = -1, r = 5: max(5, 1.2) = 5, dual clip min(5, c_clip = 3) = 3
    x = _inputs([math.log(5.0)], -1.0)
    assert _loss("ppo_clip", x, eps_clip=0.2) == pytest.approx(5.0)
    assert _loss("dual_clip", x, eps_clip=0.2, c_clip=3.0) == pytest.approx(3.0)


def test_decoupled_weights_by_pi_prox_over_pi_behave():
    # r = 1, A = 1, prox - behave = log 2: the behaviour weight 2 scales -1
    x = _inputs([0.0], 1.0, behave_gap=[math.log(2.0)])
    assert _loss("decoupled", x, eps_clip=0.2) == pytest.approx(-2.0)


def test_gspo_takes_the_sequence_ratio():
    # token log-ratios 0.1 and 0.3: the sequence ratio e^0.2 on both tokens, A = 1
    x = _inputs([0.1, 0.3], 1.0)
    spec = {"eps_clip": 0.5, "importance_sampling_level": "sequence"}
    assert _loss("gspo", x, **spec) == pytest.approx(-math.exp(0.2))


def test_cispo_keeps_the_gradient_of_a_clipped_token():
    # r = e^0.5 clipped to 1.2 and held: loss -1.2 * A * logp, gradient -1.2 * A
    x = _inputs([0.5], 1.0)
    x.logp.requires_grad_(True)
    opts = PolicyLossOptions(ppo=PPOLossSpec(eps_clip=1.0, eps_clip_higher=0.2))
    loss, stats = policy_loss("cispo", x, opts)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.2 * 0.5)
    assert x.logp.grad is not None and float(x.logp.grad) == pytest.approx(-1.2)
    assert float(stats["actor/clip_fraction"]) == 1.0


def test_sapo_gate_at_ratio_one():
    # r = 1: -(4 / tau) * sigmoid(0) * A = -2 / tau_pos for A = 1
    opts = PolicyLossOptions(sapo_tau_pos=2.0, sapo_tau_neg=4.0)
    loss, stats = policy_loss("sapo", _inputs([0.0], 1.0), opts)
    assert float(loss) == pytest.approx(-1.0) and float(stats["sapo/gate_min"]) == 1.0


def test_a_clipped_mode_needs_its_options_and_an_unknown_mode_is_named():
    with pytest.raises(ValueError, match="'gspo' needs the clipped-PPO options"):
        policy_loss("gspo", _inputs([0.0], 1.0), PolicyLossOptions())
    with pytest.raises(ValueError, match="unknown policy loss mode 'vanilla'; known: ppo_clip"):
        policy_loss("vanilla", _inputs([0.0], 1.0), PolicyLossOptions())
