"""The M2PO rule (areal_m2po.algo.m2po): hand-made cases, edge cases, validation and property
tests against two independent pure-Python references.

``literal_rule`` implements the rule by the letter, in exact rational arithmetic: drop the
largest m2 (among equal values the smallest flat index first) one at a time until the mean of
the rest is below the threshold; keep at least one. Away from a mean within rounding of the
threshold the module must agree with it. ``float64_rule`` is AReaL's formulation in Python
floats (suffix sums added from the smallest value up, each suffix mean compared in float64):
where a mean lands within rounding of the threshold, float64 decides, and the module must agree
with it everywhere. Nothing global is set.
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_m2po.algo import m2po
from areal_m2po.algo.m2po import m2_per_token, m2po_keep_mask, m2po_stats
from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking, _get_m2po_loss_mask


def literal_rule(values: list[float], thr: float) -> list[bool]:
    """Keep mask of the M2PO rule, by the letter, in exact arithmetic (O(n) Fraction ops)."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    keep = [True] * len(values)
    total, n, t = sum(Fraction(v) for v in values), len(values), Fraction(thr)
    for i in order:
        if n == 1 or total < t * n:
            break
        keep[i] = False
        total -= Fraction(values[i])
        n -= 1
    return keep


def float64_rule(values: list[float], thr: float) -> list[bool]:
    """Keep mask of AReaL's float64 formulation: the largest k whose float64 mean of the k
    smallest (summed smallest first) is < thr, at least 1; ties dropped by ascending index."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    total, n_keep = 0.0, 1
    for k, i in enumerate(reversed(order), start=1):
        total += values[i]
        if total / k < thr:
            n_keep = k
    kept = set(order[len(values) - n_keep :])
    return [i in kept for i in range(len(values))]


def _check(m2: torch.Tensor, thr: float) -> torch.Tensor:
    """The module's keep mask of ``m2``: AReaL's float64 formulation everywhere (random
    thresholds can land within rounding of a mean: hypothesis finds such ties)."""
    keep = m2po_keep_mask(m2, thr)
    assert keep.dtype == torch.bool and keep.shape == m2.shape
    assert keep.tolist() == float64_rule(m2.double().tolist(), thr)
    return keep


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------
# Hand-made cases
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values,thr",
    [
        ([0.5, 0.1, 0.05, 0.3], 0.2),
        ([0.5, 0.1, 0.05, 0.3], 0.24),
        ([5.0, 3.0, 4.0], 1.0),
        ([1.0, 1.0, 1.0, 0.0], 0.6),
        ([1.0, 0.0], 0.5),
        ([1.0, -0.0, 0.0, 1.0, -0.0], 1e-30),
    ],
)
def test_hand_cases_are_the_exact_rule(values, thr):
    # no mean within rounding of the threshold here: float64 and exact arithmetic agree
    m2 = torch.tensor(values)
    assert _check(m2, thr).tolist() == literal_rule(m2.double().tolist(), thr)


def test_hand_example_drops_only_the_largest():
    # sorted desc [0.5, 0.3, 0.1, 0.05]: mean of all 0.2375 >= 0.2; without 0.5: 0.45/3 = 0.15
    assert _check(torch.tensor([0.5, 0.1, 0.05, 0.3]), 0.2).tolist() == [False, True, True, True]


def test_nothing_masked_when_mean_below_threshold():
    assert _check(torch.tensor([0.5, 0.1, 0.05, 0.3]), 0.24).all()


def test_all_above_threshold_keeps_exactly_the_smallest():
    assert _check(torch.tensor([5.0, 3.0, 4.0]), 1.0).tolist() == [False, True, False]


def test_ties_dropped_in_ascending_flat_index_order():
    # [1, 1, 1, 0], thr 0.6: drop two of the 1s (means 0.75, 2/3, then 1/2 < 0.6)
    assert _check(torch.tensor([1.0, 1.0, 1.0, 0.0]), 0.6).tolist() == [False, False, True, True]
    # all equal and above the threshold: only the last one survives
    assert _check(torch.full((5,), 2.0), 1.0).tolist() == [False] * 4 + [True]


def test_strict_inequality_at_threshold():
    # [1, 0]: mean 0.5 is not < 0.5 -> drop the 1
    assert _check(torch.tensor([1.0, 0.0]), 0.5).tolist() == [False, True]


def test_negative_zero_equals_zero_for_ties():
    keep = _check(torch.tensor([1.0, -0.0, 0.0, 1.0, -0.0]), 1e-30)
    assert keep.tolist() == [False, True, True, False, True]


def test_signs_zeros_and_subnormals_order_as_floats():
    # the rule orders the values as floats (however the sort is keyed): negatives below -0.0
    # == 0.0 below subnormals; equal values by index
    values = [-1.0, 5e-324, -0.0, 2.5e-320, -2.5e-320, 0.0, -3.0, 1.0, -0.0, 5e-324, 1e300]
    m2 = torch.tensor(values, dtype=torch.float64)
    for thr in (1e-320, 1e-300, 0.5, 1e299):
        assert _check(m2, thr).tolist() == float64_rule(values, thr)


def test_areal_sorted_helper():
    # sorted descending input; suffix means 0.34, 0.2, 0.1, 0.05, 0 -> first < 0.15 at index 2
    sorted_m2 = torch.tensor([0.9, 0.5, 0.2, 0.1, 0.0])
    assert _get_m2po_loss_mask(sorted_m2, 0.15).tolist() == [False, False, True, True, True]
    assert _get_m2po_loss_mask(torch.tensor([3.0, 2.0]), 1.0).tolist() == [False, True]
    assert _get_m2po_loss_mask(torch.zeros(0), 1.0).tolist() == []
    with pytest.raises(ValueError, match="^sorted_m2 must be sorted in descending order$"):
        _get_m2po_loss_mask(torch.tensor([0.1, 0.9]), 0.15)


# ---------------------------------------------------------------------------------------
# A mean within rounding of the threshold: float64 decides
# ---------------------------------------------------------------------------------------


def test_a_mean_within_rounding_of_the_threshold_is_decided_in_float64():
    # exact mean of the doubles 0.1 and 0.2 is below 0.15000000000000002, their float64 mean
    # equals it: float64 (AReaL's arithmetic) drops the 0.2, exact arithmetic would keep both
    thr = (0.1 + 0.2) / 2
    assert Fraction(0.1) + Fraction(0.2) < 2 * Fraction(thr)
    m2 = torch.tensor([0.2, 0.1], dtype=torch.float64)
    assert m2po_keep_mask(m2, thr).tolist() == float64_rule([0.2, 0.1], thr) == [False, True]


def test_float64_grid_values_with_threshold_on_a_prefix_mean():
    # values on a 0.05 grid, many ties, the threshold on (or a hair beside) the float64 mean of
    # the k smallest: the rule is AReaL's float64 formulation
    rng = random.Random(11)
    for _ in range(400):
        values = [rng.randint(0, 40) * 0.05 for _ in range(rng.randint(1, 60))]
        smallest = sorted(values)[: rng.randint(1, len(values))]
        thr = (sum(smallest) / len(smallest) or 0.05) * (1 + rng.choice([0.0, 1e-15, -1e-15]))
        keep = m2po_keep_mask(torch.tensor(values, dtype=torch.float64), thr)
        assert keep.tolist() == float64_rule(values, thr)


# ---------------------------------------------------------------------------------------
# dtypes, devices, sizes
# ---------------------------------------------------------------------------------------


def test_dtypes_give_the_rule_on_their_values():
    g = _gen(2)
    base = torch.rand(3000, generator=g) ** 3
    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
        m2 = base.to(dtype)
        thr = float(m2.double().mean()) * 0.5
        keep = _check(m2, thr)
        assert 0 < int(keep.sum()) < 3000


def test_large_realistic_batch_against_prefix_means():
    # 60k tokens: compare with an O(n log n) exact check of the cut rather than the literal
    # loop: the kept set is the k smallest, k the largest count with exact mean < thr
    g = _gen(3)
    m2 = (0.3 * torch.randn(60_000, generator=g)) ** 2
    asc = sorted(m2.double().tolist())
    vals = m2.double()
    for frac in (0.99, 0.5, 0.05):
        # 1e-9 above a prefix mean: far from a rounding tie (60k values: ~1e-11 relative)
        thr = sum(asc[: int(frac * len(asc))]) / int(frac * len(asc)) * (1 + 1e-9)
        keep = m2po_keep_mask(m2, thr)
        k = int(keep.sum())
        assert 0 < k < len(asc)
        kept_sum = sum(Fraction(v) for v in vals[keep].tolist())
        assert kept_sum < k * Fraction(thr)  # the kept mean is below the threshold
        assert float(vals[~keep].min()) >= float(vals[keep].max())  # the largest went
        # keeping one more (the smallest dropped, asc[k]) would not be below it
        assert kept_sum + Fraction(asc[k]) >= (k + 1) * Fraction(thr)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    g = _gen(4)
    old = -torch.rand(32, 1024, generator=g) * 3
    prox = old + torch.exp(torch.randn(32, 1024, generator=g) * 1.5 - 2.5)
    mask = torch.rand(32, 1024, generator=g) < 0.7
    cpu = _apply_m2po_masking(old, prox, mask, 0.02)
    gpu = _apply_m2po_masking(old.cuda(), prox.cuda(), mask.cuda(), 0.02)
    assert torch.equal(gpu.cpu(), cpu)


# ---------------------------------------------------------------------------------------
# _apply_m2po_masking (and m2po_mask): shapes, edge cases, validation
# ---------------------------------------------------------------------------------------


def test_apply_is_the_rule_on_valid_tokens_and_ignores_the_rest():
    g = _gen(5)
    old = -torch.rand(8, 33, generator=g) * 3
    prox = old + 0.4 * torch.randn(8, 33, generator=g)
    mask = torch.rand(8, 33, generator=g) < 0.7
    old[~mask] = float("nan")  # garbage outside the mask is ignored
    prox[~mask] = float("inf")
    for fn in (lambda *a: m2po.m2po_mask(*a)[0], _apply_m2po_masking):
        keep = fn(old, prox, mask, 0.05)
        assert keep.dtype == torch.bool and keep.shape == mask.shape
        assert not (keep & ~mask).any()
        m2 = (old[mask].double() - prox[mask].double()) ** 2
        assert keep[mask].tolist() == literal_rule(m2.tolist(), 0.05)
        assert 0 < int(keep.sum()) < int(mask.sum())


def test_apply_empty_inputs():
    z = torch.zeros(3, 4)
    assert not _apply_m2po_masking(z, z, torch.zeros(3, 4, dtype=torch.bool), 0.1).any()
    e = torch.zeros(0, 5)
    out = _apply_m2po_masking(e, e, torch.zeros(0, 5, dtype=torch.bool), 0.1)
    assert out.shape == (0, 5) and out.dtype == torch.bool
    assert m2po_keep_mask(torch.zeros(0), 0.1).tolist() == []


def test_apply_single_token_always_kept():
    old = torch.tensor([[0.0, -5.0]])
    prox = torch.tensor([[0.0, 0.0]])
    mask = torch.tensor([[False, True]])
    assert _apply_m2po_masking(old, prox, mask, 1e-6).tolist() == [[False, True]]


def test_apply_validation_errors():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match="^loss_mask must be torch.bool, got torch.float32$"):
        _apply_m2po_masking(x, x, m.float(), 0.1)
    with pytest.raises(TypeError, match="^behave_logp must be a floating-point tensor"):
        _apply_m2po_masking(x.long(), x, m, 0.1)
    with pytest.raises(
        ValueError, match=r"^prox_logp shape \(2, 4\) does not match behave_logp shape \(2, 3\)$"
    ):
        _apply_m2po_masking(x, torch.zeros(2, 4), m, 0.1)
    with pytest.raises(ValueError, match=r"^loss_mask shape \(3, 2\)"):
        _apply_m2po_masking(x, x, torch.ones(3, 2, dtype=torch.bool), 0.1)
    for bad in (None, 0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^m2_threshold must be a positive finite number"):
            _apply_m2po_masking(x, x, m, bad)
    with pytest.raises(TypeError, match="^m2_threshold must be a real number, got str$"):
        _apply_m2po_masking(x, x, m, "0.1")


def test_apply_non_finite_at_valid_positions_raise():
    old = torch.zeros(2, 3)
    old[0, 0] = float("nan")
    old[0, 1] = float("inf")
    old[1, 2] = float("-inf")
    prox = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError, match="^behave_logp has 3 non-finite values at loss_mask positions$"
    ):
        _apply_m2po_masking(old, prox, m, 0.1)
    with pytest.raises(ValueError, match="^prox_logp has 3 non-finite values"):
        _apply_m2po_masking(prox, old, m, 0.1)
    # the same values outside loss_mask are fine
    finite = torch.isfinite(old)
    assert _apply_m2po_masking(old, prox, finite, 0.1).tolist() == finite.tolist()
    big = torch.full((1, 2), 1e200, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^\(behave_logp - prox_logp\)\^2 overflows float64"):
        _apply_m2po_masking(big, -big, torch.ones(1, 2, dtype=torch.bool), 0.1)


def test_keep_mask_validation():
    with pytest.raises(ValueError, match=r"^m2 must be 1-D"):
        m2po_keep_mask(torch.zeros(2, 2), 0.1)
    with pytest.raises(TypeError, match="^m2 must be a floating-point tensor"):
        m2po_keep_mask(torch.zeros(3, dtype=torch.int64), 0.1)
    with pytest.raises(TypeError, match="^m2 must be a torch.Tensor, got list$"):
        m2po_keep_mask([0.1], 0.1)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="^m2 has 1 non-finite values$"):
            m2po_keep_mask(torch.tensor([1.0, bad, 0.0]), 0.1)
    with pytest.raises(ValueError, match="^the sum of m2 overflows float64$"):
        m2po_keep_mask(torch.tensor([1.7e308, 1.7e308], dtype=torch.float64), 0.1)


def test_m2po_stats_by_hand():
    # valid m2 = [0.5, 0.1, 0.05, 0.3] (one padded slot), threshold 0.2 -> 0.5 masked
    old = torch.tensor(
        [[math.sqrt(0.5), math.sqrt(0.1), 7.0], [math.sqrt(0.05), math.sqrt(0.3), 0.0]]
    )
    prox = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    keep = _apply_m2po_masking(old, prox, mask, 0.2)
    assert keep.tolist() == [[False, True, False], [True, True, False]]
    m2 = m2_per_token(old, prox, mask)
    assert m2.dtype == torch.float64 and m2[0, 2].item() == 0.0
    s = m2po_stats(m2, mask, keep, 0.2)
    assert s["m2po/masked_fraction"].item() == pytest.approx(0.25)
    assert s["m2po/m2_before"].item() == pytest.approx(0.2375, rel=1e-6)
    assert s["m2po/m2_after"].item() == pytest.approx(0.15, rel=1e-6)
    assert s["m2po/threshold"].item() == pytest.approx(0.2)
    assert s["m2po/n_masked"].item() == 1.0
    assert s["m2po/n_valid"].item() == 4.0
    assert all(v.ndim == 0 and v.dtype == torch.float32 for v in s.values())
    empty = torch.zeros(2, 3, dtype=torch.bool)
    s = m2po_stats(m2, empty, empty, 0.2)
    assert s["m2po/masked_fraction"].item() == 0.0 and s["m2po/n_valid"].item() == 0.0


# ---------------------------------------------------------------------------------------
# Property tests against the literal rule
# ---------------------------------------------------------------------------------------

_SETTINGS = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
_thresholds = st.floats(min_value=1e-6, max_value=1e4, allow_nan=False, allow_infinity=False)


@_SETTINGS
@given(
    values=st.lists(
        st.floats(min_value=0.0, max_value=1e4, width=32, allow_subnormal=True),
        min_size=1,
        max_size=300,
    ),
    thr=_thresholds,
)
def test_property_wide_range_float32(values, thr):
    _check(torch.tensor(values, dtype=torch.float32), thr)


@_SETTINGS
@given(
    ints=st.lists(st.integers(min_value=0, max_value=80), min_size=1, max_size=200),
    scale=st.sampled_from([0.05, 0.1, 0.01, 1 / 64, 0.3]),
    data=st.data(),
)
def test_property_threshold_on_a_prefix_mean(ints, scale, data):
    # the threshold sits on (or a hair beside) a float64 mean of the k smallest: where rounding
    # decides, the module is AReaL's float64 formulation; a 1e-9 nudge is no tie: exact rule too
    values = [i * scale for i in ints]
    srt = sorted(values)
    k = data.draw(st.integers(min_value=1, max_value=len(srt)))
    nudge = data.draw(st.sampled_from([0.0, 1e-15, -1e-15, 1e-9]))
    thr = sum(srt[:k]) / k * (1 + nudge)
    thr = thr if thr > 0 else 1e-9
    keep = m2po_keep_mask(torch.tensor(values, dtype=torch.float64), thr)
    assert keep.tolist() == float64_rule(values, thr)
    if nudge == 1e-9:
        assert keep.tolist() == literal_rule(values, thr)


@_SETTINGS
@given(
    values=st.lists(
        st.floats(min_value=-1e3, max_value=1e3, allow_subnormal=False), min_size=1, max_size=100
    ),
    thr=_thresholds,
)
def test_property_signed_float64_values(values, thr):
    # m2 is a square in practice; the rule is the same for any finite floats
    _check(torch.tensor(values, dtype=torch.float64), thr)


@settings(max_examples=20, deadline=None, database=None)
@given(seed=st.integers(min_value=0, max_value=2**31 - 1), frac=st.floats(0.01, 0.99))
def test_property_permutation_moves_the_mask_with_the_values(seed, frac):
    g = _gen(seed)
    m2 = (torch.randn(2000, generator=g) * 0.5) ** 2
    thr = float(m2.double().sort().values[: max(1, int(frac * 2000))].mean())
    perm = torch.randperm(2000, generator=g)
    assert torch.equal(m2po_keep_mask(m2[perm], thr), m2po_keep_mask(m2, thr)[perm])


def test_global_scope_in_one_process_is_the_rule_on_the_batch():
    from areal_m2po.trainer.ppo.actor import global_m2po_mask

    g = _gen(6)
    old = -torch.rand(6, 40, generator=g) * 3
    prox = old + 0.3 * torch.randn(6, 40, generator=g)
    mask = torch.rand(6, 40, generator=g) < 0.8
    batch = {"behave_logp": old, "prox_logp": prox, "loss_mask": mask}
    keep, stats = global_m2po_mask(batch, 0.04)
    assert torch.equal(keep, _apply_m2po_masking(old, prox, mask, 0.04))
    want = m2po_stats(m2_per_token(old, prox, mask), mask, keep, 0.04)
    assert 0 < stats["m2po/n_masked"] < stats["m2po/n_valid"]
    for k, v in want.items():
        assert stats[k] == pytest.approx(v.item(), rel=1e-6), k
