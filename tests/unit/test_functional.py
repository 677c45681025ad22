"""Losses, advantage/reward maths and log-prob gathering (areal_m2po.algo; AReaL's calling
contract of the losses is tested in test_areal_compat.py).

Expected numbers are derived by hand in the comments (or by an independent plain-torch
reference). Tests use local torch.Generator objects and set nothing global.
"""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.advantages import gae_advantages
from areal_m2po.algo.aggregation import agg_loss
from areal_m2po.algo.critic_loss import ppo_critic_loss
from areal_m2po.algo.kl import binary_kl, kl_estimate
from areal_m2po.algo.logprobs import gather_logprobs_entropy
from areal_m2po.algo.normalization import group_normalize, masked_normalize
from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss
from areal_m2po.algo.reductions import masked_mean, masked_sum, masked_var
from areal_m2po.algo.reward_shaping import overlong_reward_penalty, reward_transform
from areal_m2po.algo.sapo_loss import sapo_loss

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=F64)


def _close(x: torch.Tensor, expected, atol: float = 1e-9) -> bool:
    return torch.allclose(x.detach().to(F64), torch.tensor(expected, dtype=F64), atol=atol)


def ppo_loss_kw(logp, prox, behave, adv, eps_clip, loss_mask, m2po_mask=None, **options):
    """The clipped PPO loss with its options as keywords (a PPOLossSpec built per call)."""
    spec = PPOLossSpec(eps_clip=eps_clip, **options)
    return ppo_actor_loss(logp, prox, behave, adv, loss_mask, spec, m2po_mask)


def _ppo(lp, prox, old, adv, mask, **kw):
    lp = lp.clone().requires_grad_(True)
    loss, stats = ppo_loss_kw(lp, prox, old, adv, loss_mask=mask, **kw)
    loss.backward()
    return loss, stats, lp.grad


# ---------------------------------------------------------------------------------------
# PPO actor loss: values and gradients by hand
# ---------------------------------------------------------------------------------------


def test_ppo_clip_branch_positive_advantage():
    # r = 1.5, A = 1, eps 0.2: pg1 = -1.5, pg2 = -1.2 -> max = -1.2 (clipped, constant)
    lp = _t([math.log(1.5)])
    z = _t([0.0])
    loss, stats, grad = _ppo(lp, z, z, _t([1.0]), torch.tensor([[True]]), eps_clip=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert grad.item() == pytest.approx(0.0)
    assert stats["actor/clip_fraction"].item() == pytest.approx(1.0)
    assert stats["actor/importance_weight"].item() == pytest.approx(1.5)
    # approx_kl = prox - current = -log 1.5
    assert stats["actor/approx_kl"].item() == pytest.approx(-math.log(1.5))
    assert stats["actor/pg_loss"].item() == pytest.approx(-1.2)


def test_ppo_unclipped_and_negative_advantage_and_dual_clip():
    # token 0: r = 0.5, A = +1 -> pg1 = -0.5, pg2 = -0.8 -> -0.5, d/dlp = -A r = -0.5
    # token 1: r = 1.5, A = -1 -> pg1 = 1.5, pg2 = 1.2 -> 1.5, d/dlp = -A r = +1.5
    lp = _t([math.log(0.5), math.log(1.5)])
    z = _t([0.0, 0.0])
    adv = _t([1.0, -1.0])
    mask = torch.tensor([[True, True]])
    loss, stats, grad = _ppo(lp, z, z, adv, mask, eps_clip=0.2)
    assert loss.item() == pytest.approx((-0.5 + 1.5) / 2)
    assert _close(grad, [[-0.5 / 2, 1.5 / 2]])
    assert stats["actor/clip_fraction"].item() == 0.0
    assert stats["actor/importance_weight_max"].item() == pytest.approx(1.5)
    assert stats["actor/importance_weight_min"].item() == pytest.approx(0.5)
    # dual clip c = 1.3: token 1 -> min(1.5, -A c = 1.3) = 1.3, constant -> zero grad
    loss, stats, grad = _ppo(lp, z, z, adv, mask, eps_clip=0.2, c_clip=1.3)
    assert loss.item() == pytest.approx((-0.5 + 1.3) / 2)
    assert _close(grad, [[-0.25, 0.0]])
    assert stats["actor/dual_clip_fraction"].item() == pytest.approx(0.5)


def test_ppo_eps_clip_higher():
    # r = 1.25, A = 1: eps 0.2 clips at 1.2 (loss -1.2); eps_clip_higher 0.28 -> unclipped
    # loss -1.25, grad -A r = -1.25
    lp = _t([math.log(1.25)])
    z = _t([0.0])
    m = torch.tensor([[True]])
    loss, _, grad = _ppo(lp, z, z, _t([1.0]), m, eps_clip=0.2)
    assert loss.item() == pytest.approx(-1.2) and grad.item() == 0.0
    loss, _, grad = _ppo(lp, z, z, _t([1.0]), m, eps_clip=0.2, eps_clip_higher=0.28)
    assert loss.item() == pytest.approx(-1.25)
    assert grad.item() == pytest.approx(-1.25)


def test_ppo_decoupled_behaviour_weight():
    # prox - old = log 0.5 -> w = 0.5; lp - prox = log 1.1 -> r = 1.1 (inside clip), A = 2
    # loss = -A r w = -1.1; d/dlp = -A r w = -1.1; behave_approx_kl = old - prox = log 2
    prox = _t([math.log(0.5)])
    old = _t([0.0])
    lp = prox + math.log(1.1)
    loss, stats, grad = _ppo(lp, prox, old, _t([2.0]), torch.tensor([[True]]), eps_clip=0.2)
    assert loss.item() == pytest.approx(-1.1)
    assert grad.item() == pytest.approx(-1.1)
    assert stats["actor/behave_imp_weight"].item() == pytest.approx(0.5)
    assert stats["actor/behave_imp_weight_max"].item() == pytest.approx(0.5)
    assert stats["actor/behave_approx_kl"].item() == pytest.approx(math.log(2.0))


def test_ppo_proximal_equals_old_gives_unit_weight():
    g = _gen(0)
    lp = torch.randn(3, 4, generator=g, dtype=F64)
    prox = lp + 0.1 * torch.randn(3, 4, generator=g, dtype=F64)
    adv = torch.randn(3, 4, generator=g, dtype=F64)
    mask = torch.rand(3, 4, generator=g) < 0.7
    mask[0, 0] = True
    _, stats, _ = _ppo(lp, prox, prox, adv, mask, eps_clip=0.2)
    assert stats["actor/behave_imp_weight"].item() == pytest.approx(1.0)
    assert stats["actor/behave_approx_kl"].item() == pytest.approx(0.0)


def test_ppo_masked_positions_may_hold_garbage():
    lp = _t([0.1, float("nan")])
    prox = _t([0.0, float("-inf")])
    old = _t([0.0, float("inf")])
    adv = _t([1.0, float("nan")])
    mask = torch.tensor([[True, False]])
    loss, stats, grad = _ppo(lp, prox, old, adv, mask, eps_clip=0.2)
    assert torch.isfinite(loss)
    assert torch.isfinite(grad).all()
    assert grad[0, 1].item() == 0.0
    assert all(torch.isfinite(v) for v in stats.values())


# ---------------------------------------------------------------------------------------
# Denominators and aggregation modes
# ---------------------------------------------------------------------------------------


def test_m2po_masked_token_does_not_change_other_gradients():
    # r = 1 everywhere (lp = prox): token loss -A, d/dlp_t = -A_t / n_valid
    lp = _t([0.0, 0.0, 0.0])
    z = _t([0.0, 0.0, 0.0])
    adv = _t([1.0, 2.0, 3.0])
    mask = torch.tensor([[True, True, True]])
    m2po = torch.tensor([[True, False, True]])
    loss_all, _, g_all = _ppo(lp, z, z, adv, mask, eps_clip=0.2)
    loss_m, _, g_m = _ppo(lp, z, z, adv, mask, eps_clip=0.2, m2po_mask=m2po)
    assert loss_all.item() == pytest.approx(-6.0 / 3)
    # denominator stays 3 (valid count before M2PO): loss = -(1 + 3) / 3, grads -A_t / 3
    assert loss_m.item() == pytest.approx(-4.0 / 3)
    assert _close(g_m, [[-1 / 3, 0.0, -3 / 3]])
    assert g_m[0, 0] == g_all[0, 0] and g_m[0, 2] == g_all[0, 2]


def test_rejected_token_keeps_denominator_sapo_too():
    lp = _t([0.0, 0.0]).requires_grad_(True)
    z = _t([0.0, 0.0])
    loss, _ = sapo_loss(
        lp, z, _t([1.0, 1.0]), 1.0, 1.05, torch.tensor([[True, True]]),
        m2po_mask=torch.tensor([[True, False]]),
    )  # fmt: skip
    loss.backward()
    # at r = 1 gate value (4/tau) * 0.5 = 2 for tau = 1: loss = -(2) / 2; grad -A / 2
    assert loss.item() == pytest.approx(-1.0)
    assert _close(lp.grad, [[-0.5, 0.0]])


def test_aggregation_modes_by_hand():
    # r = 1 -> token loss = -A. Row 0: one valid token (A = 2); row 1: three (A = 1, 3, 5).
    lp = torch.zeros(2, 4, dtype=F64)
    adv = _t([2.0, 0.0, 0.0, 0.0], [1.0, 3.0, 5.0, 9.0])
    mask = torch.tensor([[True, False, False, False], [True, True, True, False]])
    cases = {
        "token-mean": -(2 + 1 + 3 + 5) / 4,
        "seq-mean-token-mean": -(2 / 1 + 9 / 3) / 2,
        "seq-mean-token-sum-norm": -(2 + 1 + 3 + 5) / (2 * 4),
    }
    for mode, expected in cases.items():
        loss, _, grad = _ppo(lp, lp, lp, adv, mask, eps_clip=0.2, loss_agg_mode=mode)
        assert loss.item() == pytest.approx(expected), mode
    # seq-mean-token-mean gradient of row 1 token 0: -A / (3 * 2) = -1/6
    _, _, grad = _ppo(lp, lp, lp, adv, mask, eps_clip=0.2, loss_agg_mode="seq-mean-token-mean")
    assert grad[1, 0].item() == pytest.approx(-1 / 6)
    assert grad[0, 0].item() == pytest.approx(-2 / 2)
    # Dr.GRPO with explicit max_tokens_norm = 10: -(11) / (2 * 10)
    loss, _, _ = _ppo(
        lp, lp, lp, adv, mask, eps_clip=0.2,
        loss_agg_mode="seq-mean-token-sum-norm", max_tokens_norm=10,
    )  # fmt: skip
    assert loss.item() == pytest.approx(-11 / 20)


def test_seq_mean_token_mean_skips_rows_without_valid_tokens_and_m2po_keeps_counts():
    tl = _t([1.0, 1.0], [5.0, 7.0], [9.0, 9.0])
    mask = torch.tensor([[True, True], [True, True], [False, False]])
    keep = torch.tensor([[True, False], [True, True], [False, False]])
    # row 0: 1/2, row 1: 12/2, row 2 ignored -> (0.5 + 6) / 2
    assert agg_loss(tl, keep, mask, "seq-mean-token-mean").item() == pytest.approx(3.25)
    # token-mean: (1 + 5 + 7) / 4
    assert agg_loss(tl, keep, mask, "token-mean").item() == pytest.approx(13 / 4)


def test_empty_loss_mask_gives_zero_loss_and_grad():
    lp = torch.zeros(2, 3, dtype=F64)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, stats, grad = _ppo(lp, lp, lp, torch.ones(2, 3, dtype=F64), mask, eps_clip=0.2)
    assert loss.item() == 0.0 and (grad == 0).all()
    assert all(v.item() == 0.0 for k, v in stats.items() if "weight" not in k or "max" in k)


# ---------------------------------------------------------------------------------------
# Rejection sampling
# ---------------------------------------------------------------------------------------


def test_rejection_token_mask_and_clamp():
    # behaviour weights w = [3, 1]; lp = prox (r = 1), A = 1 -> token loss -w
    old = _t([0.0, 0.0])
    prox = _t([math.log(3.0), 0.0])
    lp = prox.clone()
    adv = _t([1.0, 1.0])
    mask = torch.tensor([[True, True]])
    rs = {"level": "token", "action": "mask", "metric": "ratio", "upper": 2.0, "lower": 0.5}
    loss, stats, grad = _ppo(lp, prox, old, adv, mask, eps_clip=0.2, rejection_sampling=rs)
    # token 0 rejected (w = 3 > 2) but still counted in the denominator: -1 / 2
    assert loss.item() == pytest.approx(-0.5)
    assert _close(grad, [[0.0, -0.5]])
    assert stats["actor/rejected_fraction"].item() == pytest.approx(0.5)
    rs_clamp = dict(rs, action="clamp")
    loss, stats, grad = _ppo(lp, prox, old, adv, mask, eps_clip=0.2, rejection_sampling=rs_clamp)
    # w clamped to 2: -(2 + 1) / 2; grad of token 0 = -A r w / 2 = -1
    assert loss.item() == pytest.approx(-1.5)
    assert _close(grad, [[-1.0, -0.5]])
    assert stats["actor/behave_imp_weight_max"].item() == pytest.approx(2.0)
    assert stats["actor/rejected_fraction"].item() == pytest.approx(0.5)


def test_rejection_sequence_level_ratio_geometric_mean():
    # row 0: log w = [log 4, 0] -> geometric mean 2 (> 1.5, rejected as a whole)
    # row 1: log w = [log 1.21, 0] -> geometric mean 1.1 (kept); weight 1.1 on both tokens
    old = torch.zeros(2, 2, dtype=F64)
    prox = _t([math.log(4.0), 0.0], [math.log(1.21), 0.0])
    lp = prox.clone()
    adv = torch.ones(2, 2, dtype=F64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    rs = {"level": "sequence", "action": "mask", "metric": "ratio", "agg": "mean", "upper": 1.5}
    loss, stats, grad = _ppo(lp, prox, old, adv, mask, eps_clip=0.2, rejection_sampling=rs)
    assert loss.item() == pytest.approx(-(1.1 + 1.1) / 4)
    assert _close(grad, [[0.0, 0.0], [-1.1 / 4, -1.1 / 4]])
    assert stats["actor/rejected_fraction"].item() == pytest.approx(0.5)
    # clamp: row 0 weight 2 -> clamped to 1.5 on both tokens
    rs_c = dict(rs, action="clamp")
    loss, _, _ = _ppo(lp, prox, old, adv, mask, eps_clip=0.2, rejection_sampling=rs_c)
    assert loss.item() == pytest.approx(-(1.5 * 2 + 1.1 * 2) / 4)
    # agg "sum": row 1 product 1.21 <= 1.5 kept, row 0 product 4 rejected -> same as mean here
    rs_s = dict(rs, agg="sum")
    loss_s, _, _ = _ppo(lp, prox, old, adv, mask, eps_clip=0.2, rejection_sampling=rs_s)
    assert loss_s.item() == pytest.approx(-(1.1 + 1.1) / 4)


def test_rejection_kl_metric():
    spec = {"level": "token", "action": "mask", "metric": "kl_k2", "agg": "mean", "upper": 0.1}

    # k2 = 0.5 (prox - old)^2: token 0 -> 0.5 (rejected), token 1 -> 0.005 (kept)
    old = _t([0.0, 0.0])
    prox = _t([1.0, 0.1])
    lp = prox.clone()
    mask = torch.tensor([[True, True]])
    loss, stats, _ = _ppo(
        lp, prox, old, _t([1.0, 1.0]), mask, eps_clip=0.2, rejection_sampling=spec
    )
    # token 1 loss -A r w = -exp(0.1); over 2 valid tokens
    assert loss.item() == pytest.approx(-math.exp(0.1) / 2)
    assert stats["actor/rejected_fraction"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="clamp"):
        ppo_loss_kw(
            lp, prox, old, _t([1.0, 1.0]), 0.2, mask,
            rejection_sampling={"action": "clamp", "metric": "kl_k1", "upper": 1.0},
        )  # fmt: skip


def test_rejection_binary_kl_metric():
    """AReaL's KPop: max of the two Bernoulli KLs of the sampled token's probabilities.

    Token 0: prox p = 1/2, behave q = 1/4.
      KL(p||q) = 1/2 ln 2 + 1/2 ln(2/3) = 0.143841; KL(q||p) = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.130812
      -> metric 0.143841. Token 1: p = q -> 0.
    """
    kl_pq = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    kl_qp = 0.25 * math.log(0.5) + 0.75 * math.log(1.5)
    assert binary_kl(_t([math.log(0.5)]), _t([math.log(0.25)])).item() == pytest.approx(kl_pq)
    assert binary_kl(_t([math.log(0.25)]), _t([math.log(0.5)])).item() == pytest.approx(kl_qp)
    prox = _t([math.log(0.5), math.log(0.3)])
    old = _t([math.log(0.25), math.log(0.3)])
    mask = torch.tensor([[True, True]])
    w0 = 2.0  # exp(prox - old) of token 0
    for upper, rejected in ((0.14, 0.5), (0.15, 0.0)):
        spec = {"metric": "binary_kl", "upper": upper}
        loss, stats, _ = _ppo(
            prox.clone(), prox, old, _t([1.0, 1.0]), mask, eps_clip=0.2, rejection_sampling=spec
        )
        kept = -1.0 if rejected else -(1.0 + w0)
        assert loss.item() == pytest.approx(kept / 2), upper
        assert stats["actor/rejected_fraction"].item() == pytest.approx(rejected)
    with pytest.raises(ValueError, match="upper"):
        ppo_loss_kw(
            prox, prox, old, _t([1.0, 1.0]), 0.2, mask,
            rejection_sampling={"metric": "binary_kl", "upper": -1.0},
        )  # fmt: skip


# ---------------------------------------------------------------------------------------
# GSPO (sequence-level ratio)
# ---------------------------------------------------------------------------------------


def test_gspo_equals_token_level_for_one_token_sequences():
    g = _gen(1)
    lp = torch.randn(6, 1, generator=g, dtype=F64) * 0.3
    prox = lp + 0.3 * torch.randn(6, 1, generator=g, dtype=F64)
    old = prox + 0.1 * torch.randn(6, 1, generator=g, dtype=F64)
    adv = torch.randn(6, 1, generator=g, dtype=F64)
    mask = torch.ones(6, 1, dtype=torch.bool)
    mask[2, 0] = False
    l_tok, s_tok, g_tok = _ppo(lp, prox, old, adv, mask, eps_clip=0.2, c_clip=3.0)
    l_seq, s_seq, g_seq = _ppo(
        lp, prox, old, adv, mask, eps_clip=0.2, c_clip=3.0, importance_sampling_level="sequence"
    )
    assert l_seq.item() == pytest.approx(l_tok.item(), abs=1e-12)
    assert torch.allclose(g_seq, g_tok, atol=1e-12)
    assert s_seq["actor/clip_fraction"] == s_tok["actor/clip_fraction"]


def test_gspo_hand_value_and_gradient():
    # log r = [log 2, 0] -> sequence ratio sqrt(2) on both tokens (eps 0.5 -> unclipped)
    # loss = -sqrt(2) (token-mean over 2 tokens of -sqrt 2); d/dlp_t = -A sqrt(2) / 2
    lp = _t([math.log(2.0), 0.0])
    z = _t([0.0, 0.0])
    mask = torch.tensor([[True, True]])
    loss, stats, grad = _ppo(
        lp, z, z, _t([1.0, 1.0]), mask, eps_clip=0.5, importance_sampling_level="sequence"
    )
    assert loss.item() == pytest.approx(-math.sqrt(2))
    assert _close(grad, [[-math.sqrt(2) / 2, -math.sqrt(2) / 2]])
    assert stats["actor/importance_weight"].item() == pytest.approx(math.sqrt(2))


# ---------------------------------------------------------------------------------------
# SAPO
# ---------------------------------------------------------------------------------------


def test_sapo_gradient_at_ratio_one_equals_vanilla_pg():
    g = _gen(2)
    old = torch.randn(3, 5, generator=g, dtype=F64)
    adv = torch.randn(3, 5, generator=g, dtype=F64)
    mask = torch.rand(3, 5, generator=g) < 0.8
    lp = old.clone().requires_grad_(True)
    loss, stats = sapo_loss(lp, old, adv, 1.0, 1.05, mask)
    loss.backward()
    lp2 = old.clone().requires_grad_(True)
    vanilla = -(torch.where(mask, adv * torch.exp(lp2 - old), 0.0)).sum() / mask.sum()
    vanilla.backward()
    assert torch.allclose(lp.grad, lp2.grad, atol=1e-12)
    assert stats["sapo/gate_mean"].item() == pytest.approx(1.0)
    assert stats["sapo/soft_gate_fraction"].item() == 0.0


def test_sapo_hand_value_gradient_and_gate():
    # r = 2, tau_pos = 1, A = 1: s = sigmoid(1) = 0.7310586; loss = -(4 / 1) s = -2.9242344
    # gate g = 4 s (1 - s) = 0.7864477; d/dlp = -A g r = -1.5728954
    lp = _t([math.log(2.0)]).requires_grad_(True)
    loss, stats = sapo_loss(lp, _t([0.0]), _t([1.0]), 1.0, 2.0, torch.tensor([[True]]))
    loss.backward()
    s = 1 / (1 + math.exp(-1))
    assert loss.item() == pytest.approx(-4 * s)
    assert lp.grad.item() == pytest.approx(-4 * s * (1 - s) * 2)
    assert stats["sapo/gate_mean"].item() == pytest.approx(4 * s * (1 - s))
    assert stats["sapo/gate_min"].item() == pytest.approx(4 * s * (1 - s))
    # A <= 0 uses tau_neg = 2: loss = -A (4/2) sigmoid(2 (r - 1)) with A = -1
    lp2 = _t([math.log(2.0)]).requires_grad_(True)
    loss2, _ = sapo_loss(lp2, _t([0.0]), _t([-1.0]), 1.0, 2.0, torch.tensor([[True]]))
    assert loss2.item() == pytest.approx(2.0 / (1 + math.exp(-2.0)))


def test_sapo_soft_gate_fraction():
    # r = e^2 with tau 1: s = sigmoid(e^2 - 1) ~ 0.9981 -> g ~ 0.0076 < 0.5
    lp = _t([2.0, 0.0])
    loss, stats = sapo_loss(
        lp, _t([0.0, 0.0]), _t([1.0, 1.0]), 1.0, 1.0, torch.tensor([[True, True]])
    )
    assert stats["sapo/soft_gate_fraction"].item() == pytest.approx(0.5)
    assert stats["actor/approx_kl"].item() == pytest.approx(-1.0)


# ---------------------------------------------------------------------------------------
# Critic
# ---------------------------------------------------------------------------------------


def test_critic_clipped_value_loss_by_hand():
    # token 0: v 1.0, old 0.5, R 2, eps 0.2 -> v_clip 0.7: (1 - 2)^2 = 1 < (0.7 - 2)^2 = 1.69
    #          loss 0.845, clipped term constant in v -> grad 0
    # token 1: v 0.6, old 0.5 -> v_clip 0.6: both 1.96 -> loss 0.98, grad (v - R) = -1.4
    v = _t([1.0, 0.6]).requires_grad_(True)
    loss, stats = ppo_critic_loss(
        v, _t([0.5, 0.5]), _t([2.0, 2.0]), 0.2, torch.tensor([[True, True]])
    )
    loss.backward()
    assert loss.item() == pytest.approx((0.845 + 0.98) / 2)
    assert _close(v.grad, [[0.0, -1.4 / 2]])
    assert stats["critic/value_clip_fraction"].item() == pytest.approx(0.5)
    assert stats["critic/values_mean"].item() == pytest.approx(0.8)
    assert stats["critic/value_loss"].item() == pytest.approx(loss.item())


# ---------------------------------------------------------------------------------------
# Input validation
# ---------------------------------------------------------------------------------------


def test_loss_validation_errors():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match="loss_mask must be torch.bool, got torch.float32"):
        ppo_loss_kw(x, x, x, x, 0.2, m.float())
    with pytest.raises(ValueError, match=r"advantages shape \(2, 2\) does not match loss_mask"):
        ppo_loss_kw(x, x, x, torch.zeros(2, 2), 0.2, m)
    with pytest.raises(ValueError, match="eps_clip must be >= 0"):
        ppo_loss_kw(x, x, x, x, -0.1, m)
    with pytest.raises(ValueError, match="c_clip must be > 1"):
        ppo_loss_kw(x, x, x, x, 0.2, m, c_clip=1.0)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        ppo_loss_kw(x, x, x, x, 0.2, m, importance_sampling_level="seq")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        ppo_loss_kw(x, x, x, x, 0.2, m, loss_agg_mode="mean")
    with pytest.raises(ValueError, match="tau_pos must be > 0"):
        sapo_loss(x, x, x, 0.0, 1.0, m)
    with pytest.raises(ValueError, match="tau_neg must be > 0"):
        sapo_loss(x, x, x, 1.0, -1.0, m)
    with pytest.raises(TypeError, match="m2po_mask must be torch.bool"):
        sapo_loss(x, x, x, 1.0, 1.0, m, m2po_mask=m.int())
    with pytest.raises(ValueError, match="value_eps_clip must be >= 0"):
        ppo_critic_loss(x, x, x, -1.0, m)


def test_bf16_inputs_are_upcast():
    g = _gen(3)
    lp = torch.randn(2, 4, generator=g).to(torch.bfloat16).requires_grad_(True)
    mask = torch.ones(2, 4, dtype=torch.bool)
    loss, stats = ppo_loss_kw(lp, lp.detach(), lp.detach(), torch.ones(2, 4), 0.2, mask)
    loss.backward()
    assert loss.dtype == torch.float32
    assert lp.grad.dtype == torch.bfloat16
    assert all(v.dtype == torch.float32 and v.ndim == 0 for v in stats.values())


# ---------------------------------------------------------------------------------------
# Masked reductions, KL, rewards, normalisation, GAE
# ---------------------------------------------------------------------------------------


def test_masked_reductions():
    x = _t([1.0, 2.0, float("nan")], [3.0, 5.0, 7.0])
    m = torch.tensor([[True, True, False], [False, True, False]])
    assert masked_sum(x, m).item() == 8.0
    assert masked_mean(x, m).item() == pytest.approx(8 / 3)
    assert masked_mean(x, m, dim=1).tolist() == pytest.approx([1.5, 5.0])
    # values 1, 2, 5: mean 8/3, deviations -5/3, -2/3, 7/3 -> squares sum 78/9 = 26/3
    # unbiased var 26/3 / 2 = 13/3, biased 26/9
    assert masked_var(x, m).item() == pytest.approx(13 / 3)
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(26 / 9)
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0


def test_kl_estimators_by_hand():
    lp = _t([math.log(0.5)])
    ref = _t([math.log(0.25)])
    # d = log 2: k1 = log 2, k2 = (log 2)^2 / 2, k3 = exp(-log 2) - 1 + log 2 = log 2 - 0.5
    assert kl_estimate(lp, ref, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(lp, ref, "k2").item() == pytest.approx(math.log(2) ** 2 / 2)
    assert kl_estimate(lp, ref, "k3").item() == pytest.approx(math.log(2) - 0.5)
    with pytest.raises(ValueError, match="estimator"):
        kl_estimate(lp, ref, "k4")


def test_reward_transform_and_overlong_penalty():
    r = _t(1.0, -3.0, 0.5)
    # (r + 0.5) * 2 = [3, -5, 2], clip 4 -> [3, -4, 2]
    assert reward_transform(r, scaling=2.0, bias=0.5, clip=4.0).tolist() == [3.0, -4.0, 2.0]
    assert reward_transform(r).tolist() == r.tolist()
    # budget 10, soft zone 4 (expected 6), factor 1: lengths 5 -> 0, 6 -> 0, 8 -> -0.5, 10 -> -1
    rew = torch.ones(4, dtype=F64)
    lens = torch.tensor([5, 6, 8, 10])
    out = overlong_reward_penalty(rew, lens, 4, 1.0, 10)
    assert out.tolist() == pytest.approx([1.0, 1.0, 0.5, 0.0])
    with pytest.raises(ValueError, match="overlong_tokens"):
        overlong_reward_penalty(rew, lens, 11, 1.0, 10)


def test_group_normalize_by_hand():
    x = _t(1.0, 3.0, 10.0, 10.0)
    # group mean/std (group 2): group 0 mean 2, unbiased std sqrt(2); group 1 std 0
    out = group_normalize(x, "group", "group", group_size=2, eps=0.0 + 1e-5)
    s = math.sqrt(2)
    assert out.tolist() == pytest.approx([-1 / (s + 1e-5), 1 / (s + 1e-5), 0.0, 0.0])
    # RLOO: leave-one-out group mean, no std: [1 - 3, 3 - 1, 0, 0]
    out = group_normalize(x, "group", None, group_size=2, mean_leave1out=True)
    assert out.tolist() == [-2.0, 2.0, 0.0, 0.0]
    # batch mean 6, biased std sqrt(((25 + 9 + 16 + 16) / 4)) = sqrt(16.5)
    out = group_normalize(x, "batch", "batch", group_size=None, std_unbiased=False, eps=0.0)
    assert out.tolist() == pytest.approx([(v - 6) / math.sqrt(16.5) for v in [1, 3, 10, 10]])
    # batch leave-one-out: element 0 -> 1 - (23 / 3)
    out = group_normalize(x, "batch", None, group_size=None, mean_leave1out=True)
    assert out[0].item() == pytest.approx(1 - 23 / 3)
    # mean none, group std of the uncentred values: group 0 sqrt((1 + 9) / 1) = sqrt(10)
    out = group_normalize(x, None, "group", group_size=2, eps=1e-5)
    assert out[0].item() == pytest.approx(1 / (math.sqrt(10) + 1e-5))
    with pytest.raises(ValueError, match="not divisible by group_size 3"):
        group_normalize(x, "group", "group", group_size=3)


def test_masked_normalize_batch_and_group():
    g = _gen(4)
    x = torch.randn(4, 5, generator=g, dtype=F64)
    m = torch.rand(4, 5, generator=g) < 0.6
    m[:, 0] = True
    out = masked_normalize(x, m, "batch", "batch")
    v = x[m]
    ref = (v - v.mean()) / (v.std(unbiased=True) + 1e-5)
    assert torch.allclose(out[m], ref)
    assert (out[~m] == 0).all()
    out = masked_normalize(x, m, "group", "group", group_size=2)
    for grp in range(2):
        rows = slice(2 * grp, 2 * grp + 2)
        v = x[rows][m[rows]]
        ref = (v - v.mean()) / (v.std() + 1e-5)
        assert torch.allclose(out[rows][m[rows]], ref)
    out = masked_normalize(x, m, "group", None, group_size=2, mean_leave1out=True)
    v = x[:2][m[:2]]
    ref = v - (v.sum() - v) / (v.numel() - 1)
    assert torch.allclose(out[:2][m[:2]], ref)


def _gae_hand(r, v, m, gamma, lam):
    adv = torch.zeros_like(r)
    for b in range(r.shape[0]):
        idx = [t for t in range(r.shape[1]) if m[b, t]]
        last = 0.0
        for k in reversed(range(len(idx))):
            t = idx[k]
            nv = v[b, idx[k + 1]].item() if k + 1 < len(idx) else 0.0
            delta = r[b, t].item() + gamma * nv - v[b, t].item()
            last = delta + gamma * lam * last
            adv[b, t] = last
    return adv, torch.where(m, adv + v, 0.0)


def test_gae_by_hand_small():
    # one row, valid tokens at t = 1, 2 (t = 0 prompt, t = 3 pad); gamma 0.9, lambda 0.5
    # delta_2 = r2 - v2 = 1 - 0.5 = 0.5 -> A2 = 0.5
    # delta_1 = r1 + 0.9 v2 - v1 = 0 + 0.45 - 0.2 = 0.25 -> A1 = 0.25 + 0.45 * 0.5 = 0.475
    r = _t([9.0, 0.0, 1.0, 9.0])
    v = _t([9.0, 0.2, 0.5, 9.0])
    m = torch.tensor([[False, True, True, False]])
    adv, ret = gae_advantages(r, v, m, 0.9, 0.5)
    assert _close(adv, [[0.0, 0.475, 0.5, 0.0]])
    assert _close(ret, [[0.0, 0.675, 1.0, 0.0]])


def test_gae_matches_hand_loop_random():
    g = _gen(5)
    r = torch.randn(5, 9, generator=g, dtype=F64)
    v = torch.randn(5, 9, generator=g, dtype=F64)
    m = torch.rand(5, 9, generator=g) < 0.6
    m[4] = False
    adv, ret = gae_advantages(r, v, m, 0.97, 0.9)
    a_ref, r_ref = _gae_hand(r, v, m, 0.97, 0.9)
    assert torch.allclose(adv, a_ref, atol=1e-12)
    assert torch.allclose(ret, r_ref, atol=1e-12)


# ---------------------------------------------------------------------------------------
# gather_logprobs_entropy
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature,chunk", [(1.0, 1024), (0.7, 3), (1.3, 1)])
def test_gather_logprobs_entropy_matches_log_softmax(temperature, chunk):
    g = _gen(6)
    logits = (3 * torch.randn(2, 5, 11, generator=g)).requires_grad_(True)
    labels = torch.randint(0, 11, (2, 5), generator=g)
    w = torch.randn(2, 5, generator=g)
    lp, ent = gather_logprobs_entropy(logits, labels, temperature, chunk_size=chunk)
    (lp * w).sum().backward()
    grad = logits.grad.clone()
    logits.grad = None
    ref_ls = torch.log_softmax(logits / temperature, dim=-1)
    ref = ref_ls.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (ref * w).sum().backward()
    assert lp.shape == labels.shape and lp.dtype == torch.float32
    assert torch.allclose(lp, ref, atol=1e-5)
    assert torch.allclose(grad, logits.grad, atol=1e-5)
    ref_ent = -(ref_ls.exp() * ref_ls).sum(-1)
    assert torch.allclose(ent, ref_ent.detach(), atol=1e-5)
    assert not ent.requires_grad


def test_gather_logprobs_flat_bf16_and_no_entropy():
    g = _gen(7)
    logits = torch.randn(7, 13, generator=g).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 13, (7,), generator=g)
    lp, ent = gather_logprobs_entropy(logits, labels, chunk_size=2, compute_entropy=False)
    assert ent is None
    lp.sum().backward()
    ref_logits = logits.detach().float().requires_grad_(True)
    ref = torch.log_softmax(ref_logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    ref.sum().backward()
    assert torch.allclose(lp, ref, atol=1e-5)
    assert logits.grad.dtype == torch.bfloat16
    assert torch.allclose(logits.grad.float(), ref_logits.grad, atol=1e-2)
    with pytest.raises(ValueError, match="labels shape"):
        gather_logprobs_entropy(logits, labels[:3])


def test_gather_logprobs_gradcheck_fp64():
    g = _gen(8)
    logits = torch.randn(5, 4, generator=g, dtype=F64, requires_grad=True)
    labels = torch.randint(0, 4, (5,), generator=g)
    assert torch.autograd.gradcheck(
        lambda z: gather_logprobs_entropy(z, labels, 0.8, chunk_size=2)[0], (logits,)
    )


def test_gather_logprobs_saves_no_fp32_vocab_copy():
    # autograd keeps only the original (bf16) logits, the labels and one float per row
    g = _gen(9)
    logits = torch.randn(64, 50, generator=g).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 50, (64,), generator=g)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = gather_logprobs_entropy(logits, labels, chunk_size=16)
    fp32_vocab = [t for t in saved if t.dtype == torch.float32 and t.numel() >= 64 * 50]
    assert not fp32_vocab
    assert sum(t.numel() for t in saved) <= logits.numel() + 2 * 64
    lp.sum().backward()
    assert logits.grad is not None


@pytest.mark.parametrize("chunk", [4, 7, 1024])
def test_gather_logprobs_strided_view_not_copied(chunk):
    # out.logits[:, :-1] is a strided view: it is saved as is (same storage), values/grad exact
    g = _gen(10)
    full = torch.randn(3, 6, 9, generator=g, requires_grad=True)
    view = full[:, :-1, :]
    labels = torch.randint(0, 9, (3, 5), generator=g)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = gather_logprobs_entropy(view, labels, 0.9, chunk_size=chunk)
    assert any(t.data_ptr() == full.data_ptr() for t in saved)
    assert sum(t.numel() for t in saved if t.is_floating_point()) <= view.numel() + 15
    lp.sum().backward()
    grad = full.grad.clone()
    full.grad = None
    ref_ls = torch.log_softmax(view / 0.9, -1)
    ref = ref_ls.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref.sum().backward()
    assert torch.allclose(lp, ref, atol=1e-5)
    assert torch.allclose(grad, full.grad, atol=1e-5)
    assert torch.allclose(ent, -(ref_ls.exp() * ref_ls).sum(-1).detach(), atol=1e-5)


def test_masked_normalize_batch_sum_spans_shards():
    """Shards normalised with all-reduced statistics equal the whole batch normalised at once.

    An all-reduce returns the whole batch's sums; record those sums on the full batch and
    hand them back in the same order to each shard.
    """
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    mask = torch.rand(6, 5) > 0.3
    whole = masked_normalize(x, mask, mean_level="batch", std_level="batch")
    global_sums: list[torch.Tensor] = []

    def record(t):
        global_sums.append(t)
        return t

    masked_normalize(x, mask, "batch", "batch", batch_sum=record)
    assert len(global_sums) == 4  # sum, count (mean); count, squared centred values (std)
    for rows in (slice(0, 2), slice(2, 6)):
        it = iter(global_sums)
        part = masked_normalize(
            x[rows], mask[rows], "batch", "batch", batch_sum=lambda t, it=it: next(it)
        )
        torch.testing.assert_close(part, whole[rows])
    # without the global sums, a shard is normalised with its own statistics (different)
    alone = masked_normalize(x[:2], mask[:2], "batch", "batch")
    assert not torch.allclose(alone, whole[:2])
