"""CISPO (areal_m2po.algo.cispo_loss, actor.use_cispo_loss): the clipped importance weight held
constant, tested by its gradient; M2PO and the behaviour weight as in the PPO loss; the config's
one-line refusals. Expected numbers are derived in the comments."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.cispo_loss import cispo_loss, cispo_token_terms
from areal_m2po.algo.ppo_loss import PPOLossSpec
from areal_m2po.api.cli_args import ActorConfig, ConfigError, PPOConfig
from areal_m2po.trainer.ppo.loss_fn import LossContext, library_actor_loss

F64 = torch.float64
SPEC = PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.28)


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=F64)


def test_value_and_gradient_by_hand_including_clipped_tokens():
    # prox = 0; lp = log r with r = [2.0, 1.1, 0.5]; A = [1, -2, 3]; band [0.8, 1.28]
    # r_hat = [1.28, 1.1, 0.8]; loss = mean_t -r_hat A lp over 3 tokens
    # gradient -r_hat A / 3 = [-1.28/3, 2.2/3, -2.4/3]: the clipped tokens (1 and 3) still
    # learn (token 1, A > 0 above the band, sits on the clipped branch of PPO, gradient 0)
    r = [2.0, 1.1, 0.5]
    lp = _t([math.log(x) for x in r]).requires_grad_(True)
    zero = torch.zeros(1, 3, dtype=F64)
    adv = _t([1.0, -2.0, 3.0])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, stats = cispo_loss(lp, zero, zero, adv, mask, SPEC)
    r_hat = [1.28, 1.1, 0.8]
    want = sum(-rh * a * math.log(x) for rh, a, x in zip(r_hat, [1, -2, 3], r, strict=True)) / 3
    assert loss.item() == pytest.approx(want)
    loss.backward()
    assert lp.grad.tolist()[0] == pytest.approx([-1.28 / 3, 2.2 / 3, -2.4 / 3])
    assert stats["actor/clip_fraction"].item() == pytest.approx(2 / 3)
    assert stats["actor/importance_weight"].item() == pytest.approx(sum(r) / 3)
    assert stats["actor/dual_clip_fraction"].item() == 0.0


def test_stop_gradient_no_gradient_through_the_weight():
    # inside the band (r_hat = r) a differentiable weight would add -A lp dr/dlp = -A lp r to
    # each token's gradient; here the gradient is -r A / N exactly, at any lp
    g = torch.Generator().manual_seed(0)
    lp = (torch.randn(3, 4, generator=g, dtype=F64) - 2.0).requires_grad_(True)
    prox = (lp + 0.05 * torch.randn(3, 4, generator=g, dtype=F64)).detach().requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    mask = torch.rand(3, 4, generator=g) < 0.7
    wide = PPOLossSpec(eps_clip=1.0, eps_clip_higher=4.0)
    loss, _ = cispo_loss(lp, prox, prox, adv, mask, wide)
    loss.backward()
    r = torch.exp(lp.detach() - prox.detach())
    n = int(mask.sum())
    torch.testing.assert_close(lp.grad, torch.where(mask, -r * adv / n, 0.0))
    assert prox.grad is None


def test_m2po_and_behaviour_weight_and_denominator():
    # two valid tokens; M2PO drops token 2. prox - behave = log 0.5 on token 1 (w = 0.5);
    # lp = prox (r = 1), A = [2, 7]: loss = -1 * 2 * lp_1 * 0.5 / 2 valid tokens; gradient
    # [-0.5, 0]: the masked token loses its gradient, the other's is not inflated
    lp = _t([-1.0, -3.0]).requires_grad_(True)
    prox = lp.detach().clone()
    behave = prox - _t([math.log(0.5), 0.0])
    mask = torch.ones(1, 2, dtype=torch.bool)
    keep = torch.tensor([[True, False]])
    loss, stats = cispo_loss(lp, prox, behave, _t([2.0, 7.0]), mask, SPEC, m2po_mask=keep)
    assert loss.item() == pytest.approx(-2.0 * -1.0 * 0.5 / 2)
    loss.backward()
    assert lp.grad.tolist() == [[-0.5, 0.0]]
    assert stats["actor/behave_imp_weight_max"].item() == pytest.approx(1.0)


def test_rejection_sampling_and_aggregation_modes_apply():
    lp = _t([-1.0, -2.0], [-0.5, -0.7])
    prox = lp.clone()
    behave = prox - _t([0.0, math.log(3.0)], [0.0, 0.0])  # w = [1, 3 | 1, 1]
    mask = torch.tensor([[True, True], [True, False]])
    adv = _t([1.0, 1.0], [1.0, 1.0])
    rs = {"upper": 2.0}  # token mask: token (0, 1) with w = 3 is rejected
    spec = PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.28, rejection_sampling=rs)
    terms = cispo_token_terms(lp, prox, behave, adv, mask, spec)
    assert terms.keep.tolist() == [[True, False], [True, False]]
    loss, stats = cispo_loss(lp, prox, behave, adv, mask, spec)
    assert loss.item() == pytest.approx(-(-1.0 - 0.5) / 3)  # -A lp over 3 valid tokens
    assert stats["actor/rejected_fraction"].item() == pytest.approx(1 / 3)
    seq = PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.28, loss_agg_mode="seq-mean-token-mean")
    loss, _ = cispo_loss(lp, prox, prox, adv, mask, seq)
    # rows: mean(1, 2) = 1.5 and 0.5; mean over 2 rows
    assert loss.item() == pytest.approx((1.5 + 0.5) / 2)


@pytest.mark.parametrize(
    "spec, message",
    [
        (PPOLossSpec(eps_clip=0.2), "positive eps_clip_higher"),
        (PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.0), "positive eps_clip_higher"),
        (PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.3, c_clip=3.0), "c_clip: CISPO has no"),
        (
            PPOLossSpec(eps_clip=0.2, eps_clip_higher=0.3, importance_sampling_level="sequence"),
            "only supports importance_sampling_level='token'",
        ),
    ],
)
def test_loss_refuses_other_options(spec, message):
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=message):
        cispo_loss(x, x, x, x, torch.ones(1, 2, dtype=torch.bool), spec)


@pytest.mark.parametrize(
    "kwargs, key, message",
    [
        (dict(use_sapo_loss=True, eps_clip_higher=4.0), "use_cispo_loss", "mutually exclusive"),
        (dict(eps_clip_higher=None), "eps_clip_higher", "positive eps_clip_higher"),
        (dict(eps_clip_higher=0.0), "eps_clip_higher", "positive eps_clip_higher"),
        (
            dict(eps_clip_higher=4.0, importance_sampling_level="sequence"),
            "importance_sampling_level",
            "CISPO only supports 'token'",
        ),
        (dict(eps_clip_higher=4.0, c_clip=3.0), "c_clip", "CISPO has none"),
    ],
)
def test_config_refuses_in_one_line_naming_the_key(kwargs, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        ActorConfig(use_cispo_loss=True, **kwargs)
    assert err.value.key == key and "\n" not in str(err.value)


def test_config_error_from_the_command_line_names_the_full_key():
    from areal_m2po.api.config_loader import load_config

    with pytest.raises(ConfigError, match="^actor.use_cispo_loss: CISPO and SAPO are mutually"):
        load_config(
            [
                "actor.use_cispo_loss=true",
                "actor.use_sapo_loss=true",
                "actor.use_decoupled_loss=false",
                "actor.eps_clip_higher=4",
            ]
        )
    cfg = load_config(["actor.use_cispo_loss=true", "actor.eps_clip=1", "actor.eps_clip_higher=4"])
    assert isinstance(cfg, PPOConfig) and cfg.actor.use_cispo_loss


def test_library_loss_uses_cispo_with_the_decoupled_behaviour_weight():
    # decoupled (the default run): w = pi_prox / pi_behave = 0.5 applies, as in the PPO loss
    cfg = ActorConfig(
        use_cispo_loss=True, eps_clip=1.0, eps_clip_higher=4.0, use_decoupled_loss=True
    )
    lp = _t([-1.0]).requires_grad_(True)
    batch = {
        "loss_mask": torch.tensor([[True]]),
        "prox_logp": lp.detach().clone(),
        "behave_logp": lp.detach() - math.log(0.5),
        "advantages": _t([2.0]),
    }
    loss, stats = library_actor_loss(lp, torch.zeros_like(lp), batch, LossContext(cfg, 4))
    # -r_hat A lp w = -1 * 2 * (-1) * 0.5
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert lp.grad.tolist() == [[-1.0]]
    assert "actor/clip_fraction" in stats
