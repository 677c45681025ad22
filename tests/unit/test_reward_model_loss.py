"""Bradley-Terry reward-model maths (areal_m2po.algo.bradley_terry) against hand-derived
numbers and torch.autograd.gradcheck in float64."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.bradley_terry import (
    bradley_terry_loss,
    last_token_index,
    pairwise_accuracy,
    pool_last_token,
    preference_stats,
)

F64 = torch.float64


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_loss_equals_minus_log_sigmoid_of_the_gap():
    chosen = torch.tensor([2.0, 0.0, -1.0], dtype=F64)
    rejected = torch.tensor([0.0, 0.0, 0.5], dtype=F64)
    # -log sigmoid(g) = log(1 + exp(-g)) for gaps 2, 0, -1.5
    expected = (_softplus(-2.0) + math.log(2.0) + _softplus(1.5)) / 3
    loss = bradley_terry_loss(chosen, rejected)
    assert loss.dim() == 0
    assert float(loss) == pytest.approx(expected, abs=1e-12)


def test_margin_is_subtracted_from_the_gap_per_pair():
    chosen = torch.tensor([2.0, 1.0], dtype=F64)
    rejected = torch.tensor([0.0, 0.0], dtype=F64)
    margin = torch.tensor([0.5, 3.0], dtype=F64)
    expected = (_softplus(-(2.0 - 0.5)) + _softplus(-(1.0 - 3.0))) / 2
    assert float(bradley_terry_loss(chosen, rejected, margin)) == pytest.approx(expected, abs=1e-12)


def test_center_rewards_coefficient_adds_the_mean_squared_sum():
    chosen = torch.tensor([2.0, 1.0], dtype=F64)
    rejected = torch.tensor([1.0, -3.0], dtype=F64)
    base = (_softplus(-1.0) + _softplus(-4.0)) / 2
    centring = ((2.0 + 1.0) ** 2 + (1.0 - 3.0) ** 2) / 2  # (9 + 4) / 2
    loss = bradley_terry_loss(chosen, rejected, center_rewards_coefficient=0.01)
    assert float(loss) == pytest.approx(base + 0.01 * centring, abs=1e-12)


def test_gradient_is_minus_one_minus_sigmoid_over_pairs():
    chosen = torch.tensor([2.0, 0.0, -1.0], dtype=F64, requires_grad=True)
    rejected = torch.tensor([0.0, 0.0, 0.5], dtype=F64, requires_grad=True)
    bradley_terry_loss(chosen, rejected).backward()
    gaps = [2.0, 0.0, -1.5]
    expected = [-(1 - 1 / (1 + math.exp(-g))) / 3 for g in gaps]
    assert chosen.grad is not None and rejected.grad is not None
    assert chosen.grad.tolist() == pytest.approx(expected, abs=1e-12)
    assert rejected.grad.tolist() == pytest.approx([-e for e in expected], abs=1e-12)


@pytest.mark.parametrize("with_margin", [False, True])
@pytest.mark.parametrize("coef", [0.0, 0.05])
def test_gradcheck_float64(with_margin: bool, coef: float):
    gen = torch.Generator().manual_seed(0)
    chosen = torch.randn(5, dtype=F64, generator=gen, requires_grad=True)
    rejected = torch.randn(5, dtype=F64, generator=gen, requires_grad=True)
    margin = torch.rand(5, dtype=F64, generator=gen) if with_margin else None
    assert torch.autograd.gradcheck(
        lambda c, r: bradley_terry_loss(c, r, margin, coef), (chosen, rejected)
    )
    assert torch.autograd.gradgradcheck(
        lambda c, r: bradley_terry_loss(c, r, margin, coef), (chosen, rejected)
    )


def test_huge_gaps_stay_finite():
    chosen = torch.tensor([1000.0, -1000.0], dtype=torch.float32, requires_grad=True)
    rejected = torch.tensor([-1000.0, 1000.0], dtype=torch.float32, requires_grad=True)
    loss = bradley_terry_loss(chosen, rejected)
    loss.backward()
    # pair 0 costs ~0, pair 1 costs ~2000; mean 1000
    assert float(loss.detach()) == pytest.approx(1000.0, rel=1e-6)
    assert chosen.grad is not None and torch.isfinite(chosen.grad).all()
    assert chosen.grad.tolist() == pytest.approx([0.0, -0.5], abs=1e-6)


def test_accuracy_counts_ties_as_wrong():
    chosen = torch.tensor([1.0, 0.0, 2.0, -1.0])
    rejected = torch.tensor([0.0, 0.0, 3.0, -2.0])
    assert float(pairwise_accuracy(chosen, rejected)) == pytest.approx(0.5)


def test_preference_stats():
    chosen = torch.tensor([1.0, 4.0])
    rejected = torch.tensor([2.0, -1.0])
    stats = preference_stats(chosen, rejected)
    assert float(stats["accuracy"]) == pytest.approx(0.5)
    assert float(stats["margin"]) == pytest.approx(((1 - 2) + (4 + 1)) / 2)
    assert float(stats["mean_reward"]) == pytest.approx((1 + 4 + 2 - 1) / 4)
    assert float(stats["min_reward"]) == -1.0
    assert float(stats["max_reward"]) == 4.0


@pytest.mark.parametrize(
    ("chosen", "rejected", "margin", "match"),
    [
        (torch.zeros(3), torch.zeros(2), None, "same length"),
        (torch.zeros(2, 1), torch.zeros(2, 1), None, "1-D"),
        (torch.zeros(0), torch.zeros(0), None, "empty"),
        (torch.zeros(2), torch.zeros(2), torch.zeros(3), "margin"),
    ],
)
def test_bad_shapes_raise(chosen, rejected, margin, match):
    with pytest.raises(ValueError, match=match):
        bradley_terry_loss(chosen, rejected, margin)


def test_negative_centring_coefficient_raises():
    with pytest.raises(ValueError, match="center_rewards_coefficient"):
        bradley_terry_loss(torch.zeros(1), torch.zeros(1), center_rewards_coefficient=-1.0)


def test_last_token_index_left_and_right_padding():
    mask = torch.tensor(
        [
            [1, 1, 1, 0, 0],  # right padded: last real token at 2
            [0, 0, 1, 1, 1],  # left padded: 4
            [1, 1, 1, 1, 1],  # full: 4
            [0, 1, 0, 0, 0],  # a single token: 1
        ]
    )
    assert last_token_index(mask).tolist() == [2, 4, 4, 1]
    assert last_token_index(mask.bool()).tolist() == [2, 4, 4, 1]


def test_pool_last_token_reads_that_column():
    values = torch.arange(10.0).view(2, 5, 1)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 1, 1, 1]])
    assert pool_last_token(values, mask).tolist() == [1.0, 9.0]


def test_empty_row_and_bad_mask_raise():
    with pytest.raises(ValueError, match=r"rows \[1\] have no tokens"):
        last_token_index(torch.tensor([[1, 0], [0, 0]]))
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        last_token_index(torch.ones(3))
    with pytest.raises(ValueError, match="same"):
        pool_last_token(torch.zeros(2, 3), torch.ones(2, 4))
