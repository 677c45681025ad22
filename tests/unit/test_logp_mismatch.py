"""The training-inference mismatch figures (algo/logp_mismatch.py) against hand values."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.algo.logp_mismatch import MISMATCH_KEYS, mismatch_partials, mismatch_stats

BEHAVE = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
TRAINER = torch.tensor([[-1.1, -2.0, -0.3], [-0.1, -2.5, -9.0]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def _k3(d: float) -> float:
    return math.exp(-d) - 1 + d


def test_figures_by_hand():
    # d = behave - trainer over the mask: 0.1, 0, -0.2, 0, -0.5 (the masked -9.0 is ignored)
    stats = mismatch_stats(*mismatch_partials(BEHAVE, TRAINER, MASK))
    assert list(stats) == list(MISMATCH_KEYS)
    assert stats["tokens"] == 5
    assert stats["abs_mean"] == pytest.approx(0.8 / 5, abs=1e-7)
    assert stats["abs_max"] == pytest.approx(0.5, abs=1e-7)
    want_kl = (_k3(0.1) + _k3(-0.2) + _k3(-0.5)) / 5  # = 0.0349923
    assert stats["kl"] == pytest.approx(want_kl, abs=1e-7)
    assert stats["kl"] == pytest.approx(0.0349922894, abs=1e-8)


def test_equal_logprobs_give_zero_and_no_token_gives_nothing():
    stats = mismatch_stats(*mismatch_partials(BEHAVE, BEHAVE.clone(), MASK))
    assert stats == {"abs_mean": 0.0, "abs_max": 0.0, "kl": 0.0, "tokens": 5.0}
    empty = torch.zeros_like(MASK)
    sums, maxes = mismatch_partials(BEHAVE, TRAINER, empty)
    assert sums.tolist() == [0.0, 0.0, 0.0] and maxes.tolist() == [0.0]
    assert mismatch_stats(sums, maxes) == {}


def test_partials_of_two_ranks_combine_to_the_whole():
    """Summing the sums and taking the max of the maxes over row splits (what the actor's
    all-reduces do) gives the figures of the whole batch."""
    a = mismatch_partials(BEHAVE[:1], TRAINER[:1], MASK[:1])
    b = mismatch_partials(BEHAVE[1:], TRAINER[1:], MASK[1:])
    combined = mismatch_stats(a[0] + b[0], torch.maximum(a[1], b[1]))
    whole = mismatch_stats(*mismatch_partials(BEHAVE, TRAINER, MASK))
    assert combined == pytest.approx(whole, abs=1e-12)


def test_kl_is_never_negative_and_float64():
    g = torch.Generator().manual_seed(0)
    behave = -torch.rand(4, 7, generator=g) * 5
    trainer = behave + torch.randn(4, 7, generator=g)
    sums, maxes = mismatch_partials(behave, trainer, torch.ones(4, 7, dtype=torch.bool))
    assert sums.dtype == maxes.dtype == torch.float64
    assert mismatch_stats(sums, maxes)["kl"] > 0


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="trainer_logp shape"):
        mismatch_partials(BEHAVE, TRAINER[:, :2], MASK)
    with pytest.raises(TypeError, match="mask must be torch.bool"):
        mismatch_partials(BEHAVE, TRAINER, MASK.float())
    with pytest.raises(TypeError, match="behave_logp must be a floating-point"):
        mismatch_partials(BEHAVE.long(), TRAINER, MASK)
