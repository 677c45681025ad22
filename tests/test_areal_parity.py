"""Where this trainer and AReaL could differ (docs/areal_parity.md): each switch, by hand.

Every expected number is derived in the comments. Each test checks the setting that gives
AReaL's behaviour and, where our default differs, our default too.
"""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.api.cli_args import ActorConfig, ConfigError, RejectionSamplingConfig
from areal_m2po.trainer.ppo.actor import PPOActor
from areal_m2po.utils.functional import ppo_actor_loss_fn, sapo_loss_fn

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
        "logprobs": _t([0.0]),
        "prox_logp": prox,
        "advantages": _t([2.0]),
    }
    lp = (prox + math.log(1.1)).requires_grad_(True)
    loss, _ = actor._loss_fn(lp, torch.zeros_like(lp), mb, step_in_update=0)
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
    # AReaL: loss = (1/2) sum_t -A_mean r w_t = (1/2)(-2 - 6) = -4, and r = exp(mean lp - prox)
    # gives d r / d lp_t = r / 2, so d loss / d lp_t = (1/2) sum_t' -A_mean w_t' / 2 = -2 for
    # both tokens. (Per-token GSPO-token gradient would be -A_t w_t / 2 = [-0.5, -4.5].)
    lp = _t([0.0, 0.0]).requires_grad_(True)
    prox = _t([0.0, 0.0])
    old = prox - torch.log(_t([1.0, 3.0]))
    mask = torch.tensor([[True, True]])
    loss, _ = ppo_actor_loss_fn(
        lp, prox, old, _t([1.0, 3.0]), 0.5, mask, importance_sampling_level="sequence"
    )
    loss.backward()
    assert loss.item() == pytest.approx(-4.0)
    assert torch.allclose(lp.grad, _t([-2.0, -2.0]))


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
    loss, _ = ppo_actor_loss_fn(
        lp, z, z, _t([1.0, 7.0]), 0.5, mask, importance_sampling_level="sequence", m2po_mask=keep
    )
    loss.backward()
    assert loss.item() == pytest.approx(-0.6)
    assert torch.allclose(lp.grad, _t([-0.6, 0.0]))
