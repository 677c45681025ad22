"""DPO maths (areal_m2po.algo.dpo and AReaL's names in areal_m2po.areal.utils.functional) against numbers derived by
hand with math.log/exp, the gradient's sign and size, and bad input."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.dpo import (
    dpo_pair_logratios,
    dpo_preference_loss,
    dpo_reward_stats,
    pair_sequence_logps,
)
from areal_m2po.areal.utils.functional import functional as areal_compat

F64 = torch.float64


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# two pairs over 4 columns: rows 0/1 are pair 0 (chosen, rejected), rows 2/3 pair 1
LOGP = torch.tensor(
    [
        [-9.0, -1.0, -2.0, 0.0],
        [-9.0, -3.0, -1.5, -0.5],
        [-9.0, -0.5, 0.0, 0.0],
        [-9.0, -2.0, -2.0, -4.0],
    ],
    dtype=F64,
)
REF = torch.tensor(
    [
        [-5.0, -1.5, -2.5, 0.0],
        [-5.0, -2.0, -1.0, -1.0],
        [-5.0, -1.0, 0.0, 0.0],
        [-5.0, -1.0, -3.0, -3.0],
    ],
    dtype=F64,
)
MASK = torch.tensor(
    [
        [False, True, True, False],
        [False, True, True, True],
        [False, True, False, False],
        [False, True, True, True],
    ]
)
# log-ratios by hand (completion tokens only):
#   pair 0 chosen   (-1 + 1.5) + (-2 + 2.5)              = 1.0   (2 tokens)
#   pair 0 rejected (-3 + 2) + (-1.5 + 1) + (-0.5 + 1)    = -1.0  (3 tokens)
#   pair 1 chosen   (-0.5 + 1)                             = 0.5   (1 token)
#   pair 1 rejected (-2 + 1) + (-2 + 3) + (-4 + 3)         = -1.0  (3 tokens)
CHOSEN, REJECTED = [1.0, 0.5], [-1.0, -1.0]
CHOSEN_AVG, REJECTED_AVG = [0.5, 0.5], [-1.0 / 3, -1.0 / 3]


def test_pair_logratios_sum_the_completion_tokens():
    chosen, rejected = dpo_pair_logratios(LOGP, REF, MASK)
    assert chosen.tolist() == pytest.approx(CHOSEN, abs=1e-12)
    assert rejected.tolist() == pytest.approx(REJECTED, abs=1e-12)
    assert chosen.dtype == F64


def test_pair_logratios_average_per_completion_token():
    chosen, rejected = dpo_pair_logratios(LOGP, REF, MASK, average=True)
    assert chosen.tolist() == pytest.approx(CHOSEN_AVG, abs=1e-12)
    assert rejected.tolist() == pytest.approx(REJECTED_AVG, abs=1e-12)


def test_pair_sequence_logps_columns_are_chosen_then_rejected():
    sums = pair_sequence_logps(LOGP, MASK)
    assert sums.shape == (2, 2)
    assert sums.tolist() == [[-3.0, -5.0], [-0.5, -8.0]]


def test_sums_are_float64_even_for_float32_log_probs():
    """A long float32 completion: the float64 sum keeps a difference float32 rounding loses."""
    n = 100_000
    logp = torch.full((2, n), -1.0, dtype=torch.float32)
    logp[0, 0] = -1.0 + 2**-10  # exact in float32
    ref = torch.zeros_like(logp)
    chosen, rejected = dpo_pair_logratios(logp, ref, torch.ones(2, n, dtype=torch.bool))
    assert float(chosen - rejected) == 2**-10


def test_sigmoid_loss_is_minus_log_sigmoid_of_beta_times_h():
    h = torch.tensor([2.0, 0.0, -1.0], dtype=F64)
    loss = dpo_preference_loss(h, beta=0.5)
    # -log sigmoid(z) = log(1 + exp(-z)) for z = 1, 0, -0.5
    expected = [_softplus(-1.0), math.log(2.0), _softplus(0.5)]
    assert loss.tolist() == pytest.approx(expected, abs=1e-12)


def test_label_smoothing_mixes_the_flipped_label():
    h = torch.tensor([2.0, -1.0], dtype=F64)
    loss = dpo_preference_loss(h, beta=0.5, label_smoothing=0.1)
    expected = [0.9 * _softplus(-z) + 0.1 * _softplus(z) for z in (1.0, -0.5)]
    assert loss.tolist() == pytest.approx(expected, abs=1e-12)


def test_ipo_loss_is_the_squared_distance_to_one_over_two_beta():
    h = torch.tensor([1.5, 2.0, -1.0], dtype=F64)
    loss = dpo_preference_loss(h, beta=0.25, loss_type="ipo")  # target 1 / (2 * 0.25) = 2
    assert loss.tolist() == pytest.approx([0.25, 0.0, 9.0], abs=1e-12)


def test_end_to_end_loss_of_the_two_pairs_by_hand():
    chosen, rejected = dpo_pair_logratios(LOGP, REF, MASK)
    loss = dpo_preference_loss(chosen - rejected, beta=0.1).mean()
    # h = 2.0 and 1.5
    expected = (_softplus(-0.2) + _softplus(-0.15)) / 2
    assert float(loss) == pytest.approx(expected, abs=1e-12)
    avg_c, avg_r = dpo_pair_logratios(LOGP, REF, MASK, average=True)
    ipo = dpo_preference_loss(avg_c - avg_r, beta=0.1, loss_type="ipo").mean()
    h_avg = 0.5 + 1.0 / 3
    assert float(ipo) == pytest.approx((h_avg - 5.0) ** 2, abs=1e-12)


def test_gradient_raises_chosen_and_lowers_rejected_log_probs():
    """d loss / d logp: negative on the chosen completion's tokens (gradient descent raises
    them), positive on the rejected's, zero off the completion; size beta * sigmoid(-beta h)."""
    logp = LOGP.clone().requires_grad_(True)
    chosen, rejected = dpo_pair_logratios(logp, REF, MASK)
    dpo_preference_loss(chosen - rejected, beta=0.1).sum().backward()
    assert logp.grad is not None
    g = logp.grad
    for pair, h in enumerate((2.0, 1.5)):
        size = 0.1 * _sigmoid(-0.1 * h)
        c, r = 2 * pair, 2 * pair + 1
        assert g[c][MASK[c]].tolist() == pytest.approx([-size] * int(MASK[c].sum()), abs=1e-12)
        assert g[r][MASK[r]].tolist() == pytest.approx([size] * int(MASK[r].sum()), abs=1e-12)
    assert float(g[~MASK].abs().max()) == 0.0


def test_label_smoothing_pushes_back_a_pair_already_far_apart():
    """With eps > 0 the gradient in h, -beta((1 - eps) sigmoid(-beta h) - eps sigmoid(beta h)),
    changes sign where the pair's odds reach (1 - eps) / eps; without smoothing it never does."""
    beta, eps = 1.0, 0.1
    turn = math.log((1 - eps) / eps)
    for h, sign in ((turn - 1.0, -1.0), (turn + 1.0, 1.0)):
        x = torch.tensor([h], dtype=F64, requires_grad=True)
        dpo_preference_loss(x, beta=beta, label_smoothing=eps).sum().backward()
        assert x.grad is not None
        expected = -beta * ((1 - eps) * _sigmoid(-beta * h) - eps * _sigmoid(beta * h))
        assert float(x.grad) == pytest.approx(expected, abs=1e-12)
        assert math.copysign(1.0, float(x.grad)) == sign
    x = torch.tensor([50.0], dtype=F64, requires_grad=True)
    dpo_preference_loss(x, beta=beta).sum().backward()
    assert x.grad is not None and float(x.grad) < 0


def test_ipo_gradient_is_twice_the_distance_to_the_target():
    x = torch.tensor([1.5, 3.0], dtype=F64, requires_grad=True)
    dpo_preference_loss(x, beta=0.25, loss_type="ipo").sum().backward()
    assert x.grad is not None
    assert x.grad.tolist() == pytest.approx([2 * (1.5 - 2.0), 2 * (3.0 - 2.0)], abs=1e-12)


def test_gradcheck_in_float64():
    logp = LOGP.clone().requires_grad_(True)

    def loss(x: torch.Tensor) -> torch.Tensor:
        c, r = dpo_pair_logratios(x, REF, MASK)
        return dpo_preference_loss(c - r, beta=0.3, label_smoothing=0.2)

    assert torch.autograd.gradcheck(loss, (logp,))


def test_policy_equal_to_reference_gives_log_two_and_zero_rewards():
    chosen, rejected = dpo_pair_logratios(REF, REF, MASK)
    loss = dpo_preference_loss(chosen - rejected, beta=0.1)
    assert loss.tolist() == pytest.approx([math.log(2.0)] * 2, abs=1e-12)
    stats = dpo_reward_stats(chosen, rejected, 0.1)
    assert {k: float(v) for k, v in stats.items()} == {
        "chosen_reward": 0.0,
        "rejected_reward": 0.0,
        "margin": 0.0,
        "accuracy": 0.0,  # a tie counts as wrong
    }


def test_reward_stats_are_beta_times_the_log_ratios():
    chosen = torch.tensor([1.0, 0.5, -2.0], dtype=F64)
    rejected = torch.tensor([-1.0, 1.0, -3.0], dtype=F64)
    stats = dpo_reward_stats(chosen, rejected, 0.5)
    assert float(stats["chosen_reward"]) == pytest.approx(0.5 * (1.0 + 0.5 - 2.0) / 3)
    assert float(stats["rejected_reward"]) == pytest.approx(0.5 * (-1.0 + 1.0 - 3.0) / 3)
    assert float(stats["margin"]) == pytest.approx(0.5 * (2.0 - 0.5 + 1.0) / 3)
    assert float(stats["accuracy"]) == pytest.approx(2 / 3)


def test_huge_logits_stay_finite():
    h = torch.tensor([-1e4, 1e4], dtype=torch.float32, requires_grad=True)
    loss = dpo_preference_loss(h, beta=1.0, label_smoothing=0.25)
    loss.sum().backward()
    assert torch.isfinite(loss).all() and h.grad is not None and torch.isfinite(h.grad).all()
    assert float(loss[0].detach()) == pytest.approx(0.75 * 1e4, rel=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.0}, "beta must be > 0, got 0.0"),
        ({"beta": -1.0}, "beta must be > 0"),
        ({"beta": 0.1, "label_smoothing": 0.5}, r"label_smoothing must be in \[0, 0.5\)"),
        ({"beta": 0.1, "label_smoothing": -0.1}, r"label_smoothing must be in \[0, 0.5\)"),
        ({"beta": 0.1, "loss_type": "hinge"}, "loss_type must be one of"),
        (
            {"beta": 0.1, "loss_type": "ipo", "label_smoothing": 0.1},
            "label_smoothing applies to loss_type 'sigmoid' only",
        ),
    ],
)
def test_bad_loss_arguments(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        dpo_preference_loss(torch.zeros(2), **kwargs)


def test_bad_layouts():
    with pytest.raises(ValueError, match=r"must be \[2P, T\]"):
        pair_sequence_logps(LOGP[:3], MASK[:3])
    with pytest.raises(ValueError, match="does not match"):
        dpo_pair_logratios(LOGP, REF[:, :3], MASK)
    empty = MASK.clone()
    empty[3] = False
    with pytest.raises(ValueError, match=r"loss_mask rows \[3\] have no completion token"):
        dpo_pair_logratios(LOGP, REF, empty)
    with pytest.raises(TypeError, match="loss_mask must be torch.bool"):
        dpo_pair_logratios(LOGP, REF, MASK.long())


# ----------------------------------------------------------------------- AReaL's names (compat)
def _packed(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """AReaL's packed layout of the padded rows above: per sequence the (full) 4 tokens, with
    the log-probs moved one position left (position t holds token t + 1's log-prob)."""
    seqs = [torch.cat([row[1:], row.new_zeros(1)]) for row in x]
    return torch.cat(seqs), torch.cat(list(mask))


def test_compat_pair_logratios_on_the_packed_layout():
    logp, mask = _packed(LOGP, MASK)
    ref, _ = _packed(REF, MASK)
    cu = torch.tensor([0, 4, 8, 12, 16])
    policy, ref_sums, lens = areal_compat.dpo_pair_logratios(
        logp, ref, cu, mask, torch.tensor([True, True])
    )
    assert policy.tolist() == [[-3.0, -5.0], [-0.5, -8.0]]
    assert ref_sums.tolist() == [[-4.0, -4.0], [-1.0, -7.0]]
    assert lens.tolist() == [[2.0, 3.0], [1.0, 3.0]]
    only_second, _, _ = areal_compat.dpo_pair_logratios(
        logp, ref, cu, mask, torch.tensor([False, True])
    )
    assert only_second.tolist() == [[-0.5, -8.0]]


def test_compat_preference_loss_is_ours_without_smoothing():
    h = torch.tensor([2.0, -1.0])
    for loss_type in ("sigmoid", "ipo"):
        theirs = areal_compat.dpo_preference_loss(h, beta=0.5, loss_type=loss_type)
        ours = dpo_preference_loss(h, beta=0.5, loss_type=loss_type)
        assert torch.equal(theirs, ours)
