"""M2PO masking: hand-made cases, edge cases, validation, and property tests (hypothesis).

The oracle is ``m2po_keep_mask_sorted_reference`` (stable descending sort + float64 suffix
means); the properties are checked independently of it. Nothing global is set.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from areal_m2po.utils import functional
from areal_m2po.utils.functional import (
    apply_m2po_masking,
    get_m2po_loss_mask,
    m2_per_token,
    m2po_keep_mask,
    m2po_keep_mask_sorted_reference,
    m2po_stats,
)

METHODS = ("auto", "select", "sort")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _all_impls(m2: torch.Tensor, thr: float) -> list[torch.Tensor]:
    return [m2po_keep_mask_sorted_reference(m2, thr)] + [
        m2po_keep_mask(m2, thr, method=mth) for mth in METHODS
    ]


# ---------------------------------------------------------------------------------------
# Hand-made cases
# ---------------------------------------------------------------------------------------


def test_hand_example_drops_only_the_largest():
    # sorted desc [0.5, 0.3, 0.1, 0.05]: mean of all 0.2375 >= 0.2; without 0.5: 0.45/3 = 0.15
    m2 = torch.tensor([0.5, 0.1, 0.05, 0.3])
    for keep in _all_impls(m2, 0.2):
        assert keep.tolist() == [False, True, True, True]


def test_nothing_masked_when_mean_below_threshold():
    m2 = torch.tensor([0.5, 0.1, 0.05, 0.3])
    for keep in _all_impls(m2, 0.24):
        assert keep.all()


def test_all_above_threshold_keeps_exactly_the_smallest():
    m2 = torch.tensor([5.0, 3.0, 4.0])
    for keep in _all_impls(m2, 1.0):
        assert keep.tolist() == [False, True, False]


def test_ties_dropped_in_ascending_flat_index_order():
    # [1, 1, 1, 0], thr 0.6: drop two of the 1s (means 0.75, 2/3, then 1/2 < 0.6);
    # the earliest ones go first -> keep index 2 and 3
    m2 = torch.tensor([1.0, 1.0, 1.0, 0.0])
    for keep in _all_impls(m2, 0.6):
        assert keep.tolist() == [False, False, True, True]
    # all equal and above the threshold: only the last one survives
    m2 = torch.full((5,), 2.0)
    for keep in _all_impls(m2, 1.0):
        assert keep.tolist() == [False, False, False, False, True]


def test_strict_inequality_at_threshold():
    # [1, 0]: mean 0.5 is not < 0.5 -> drop the 1
    m2 = torch.tensor([1.0, 0.0])
    for keep in _all_impls(m2, 0.5):
        assert keep.tolist() == [False, True]


def test_negative_zero_equals_zero_for_ties():
    m2 = torch.tensor([1.0, -0.0, 0.0, 1.0, -0.0])
    # values below the threshold are never dropped, whatever the sign of zero
    for keep in _all_impls(m2, 1e-30):
        assert keep.tolist() == [False, True, True, False, True]


def test_get_m2po_loss_mask_matches_areal_convention():
    # sorted descending input; True = keep; the largest entries are masked first
    sorted_m2 = torch.tensor([0.9, 0.5, 0.2, 0.1, 0.0])
    # suffix means: 0.34, 0.2, 0.1, 0.05, 0 -> first < 0.15 at index 2
    assert get_m2po_loss_mask(sorted_m2, 0.15).tolist() == [False, False, True, True, True]
    assert get_m2po_loss_mask(torch.tensor([3.0, 2.0]), 1.0).tolist() == [False, True]
    assert get_m2po_loss_mask(torch.zeros(0), 1.0).tolist() == []


def test_dtypes_bf16_fp16_fp64_match_reference():
    g = _gen(0)
    base = torch.rand(5000, generator=g) ** 3
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        m2 = base.to(dtype)
        thr = float(m2.double().mean()) * 0.5
        ref = m2po_keep_mask_sorted_reference(m2, thr)
        assert 0 < int(ref.sum()) < 5000
        for mth in METHODS:
            assert torch.equal(m2po_keep_mask(m2, thr, method=mth), ref), (dtype, mth)


def test_large_realistic_batch_matches_reference():
    g = _gen(1)
    m2 = (0.3 * torch.randn(60_000, generator=g)) ** 2
    srt, _ = torch.sort(m2)
    for frac in (0.99, 0.5, 0.05):
        k = int(frac * m2.numel())
        thr = float(srt[:k].double().mean()) * (1 + 1e-7)
        ref = m2po_keep_mask_sorted_reference(m2, thr)
        assert abs(int(ref.sum()) - k) <= 2
        assert torch.equal(m2po_keep_mask(m2, thr), ref)


def test_narrow_range_goes_through_every_digit():
    # values within 1e-6 of each other share the top digit: exercises deeper levels
    g = _gen(2)
    m2 = 1.0 + 1e-6 * torch.rand(20_000, generator=g)
    thr = 1.0 + 5e-7
    assert torch.equal(
        m2po_keep_mask(m2, thr, method="select"), m2po_keep_mask_sorted_reference(m2, thr)
    )
    ties = torch.full((10_000,), 0.25)
    ties[::7] = 0.75
    thr = 0.3
    assert torch.equal(
        m2po_keep_mask(ties, thr, method="select"), m2po_keep_mask_sorted_reference(ties, thr)
    )


# ---------------------------------------------------------------------------------------
# apply_m2po_masking: shapes, edge cases, validation
# ---------------------------------------------------------------------------------------


def test_apply_matches_reference_on_valid_tokens():
    g = _gen(3)
    old = -torch.rand(8, 33, generator=g) * 3
    prox = old + 0.4 * torch.randn(8, 33, generator=g)
    mask = torch.rand(8, 33, generator=g) < 0.7
    old[~mask] = float("nan")  # garbage outside the mask is ignored
    keep = apply_m2po_masking(old, prox, mask, 0.05)
    assert keep.dtype == torch.bool and keep.shape == mask.shape
    assert not (keep & ~mask).any()
    m2 = (old[mask] - prox[mask]) ** 2
    assert torch.equal(keep[mask], m2po_keep_mask_sorted_reference(m2, 0.05))
    assert 0 < int(keep.sum()) < int(mask.sum())


def _spy_select(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, bool]]:
    """Record (n_pad_zeros, returned a mask) for each padded-grid selection call."""
    calls: list[tuple[int, bool]] = []
    real = functional._m2po_keep_mask_select

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append((kwargs.get("n_pad_zeros", 0), out is not None))
        return out

    monkeypatch.setattr(functional, "_m2po_keep_mask_select", spy)
    return calls


def test_apply_padded_grid_path_matches_reference(monkeypatch):
    # big enough for the CPU selection path on the padded grid (no compaction)
    calls = _spy_select(monkeypatch)
    g = _gen(4)
    old = -torch.rand(16, 1024, generator=g) * 3
    mask = torch.rand(16, 1024, generator=g) < 0.7
    heavy = torch.exp(torch.randn(16, 1024, generator=g) * 1.5 - 2.5)
    old[~mask] = float("nan")
    for prox, thr in ((old + 0.05 * torch.randn(16, 1024, generator=g), 0.04), (old + heavy, 0.02)):
        prox = torch.where(mask, prox, torch.tensor(float("inf")))
        keep = apply_m2po_masking(old, prox, mask, thr)
        m2 = (old[mask] - prox[mask]) ** 2
        assert torch.equal(keep[mask], m2po_keep_mask_sorted_reference(m2, thr))
        assert not (keep & ~mask).any()
    # first case: nothing to mask (early exit); second: padded-grid selection
    assert calls == [(int((~mask).sum()), True)]


def test_apply_padded_grid_cut_among_tiny_values_falls_back(monkeypatch):
    # valid m2 are exact zeros and subnormals; the cut falls in the bin holding the padding
    # zeros, so the padded-grid path defers to compaction; result still equals the reference
    calls = _spy_select(monkeypatch)
    g = _gen(5)
    old = torch.zeros(8, 2048)
    mask = torch.rand(8, 2048, generator=g) < 0.8
    tiny = torch.where(torch.rand(8, 2048, generator=g) < 0.5, 0.0, 1e-21)
    prox = old + tiny * torch.rand(8, 2048, generator=g)
    thr = 1e-44
    keep = apply_m2po_masking(old, prox, mask, thr)
    m2 = (old[mask] - prox[mask]) ** 2
    assert torch.equal(keep[mask], m2po_keep_mask_sorted_reference(m2, thr))
    assert not (keep & ~mask).any()
    assert calls[0] == (int((~mask).sum()), False)  # deferred, then compacted select
    assert calls[1] == (0, True)


def test_apply_empty_inputs():
    z = torch.zeros(3, 4)
    assert not apply_m2po_masking(z, z, torch.zeros(3, 4, dtype=torch.bool), 0.1).any()
    e = torch.zeros(0, 5)
    out = apply_m2po_masking(e, e, torch.zeros(0, 5, dtype=torch.bool), 0.1)
    assert out.shape == (0, 5) and out.dtype == torch.bool
    assert m2po_keep_mask(torch.zeros(0), 0.1).tolist() == []
    assert m2po_keep_mask_sorted_reference(torch.zeros(0), 0.1).tolist() == []


def test_apply_single_token_always_kept():
    old = torch.tensor([[0.0, -5.0]])
    prox = torch.tensor([[0.0, 0.0]])
    mask = torch.tensor([[False, True]])
    assert apply_m2po_masking(old, prox, mask, 1e-6).tolist() == [[False, True]]


def test_apply_validation_errors():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match="^loss_mask must be torch.bool, got torch.float32$"):
        apply_m2po_masking(x, x, m.float(), 0.1)
    with pytest.raises(
        ValueError, match=r"prox_logp shape \(2, 4\) does not match old_logp shape \(2, 3\)"
    ):
        apply_m2po_masking(x, torch.zeros(2, 4), m, 0.1)
    with pytest.raises(ValueError, match=r"loss_mask shape \(3, 2\)"):
        apply_m2po_masking(x, x, torch.ones(3, 2, dtype=torch.bool), 0.1)
    for bad in (None, 0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="m2_threshold must be a positive number"):
            apply_m2po_masking(x, x, m, bad)
    with pytest.raises(TypeError, match="m2_threshold must be a real number"):
        apply_m2po_masking(x, x, m, "0.1")


def test_apply_non_finite_at_valid_positions_raise():
    old = torch.zeros(2, 3)
    old[0, 0] = float("nan")
    old[0, 1] = float("inf")
    old[1, 2] = float("-inf")
    prox = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError, match="^old_logp has 3 non-finite values at loss_mask positions$"
    ):
        apply_m2po_masking(old, prox, m, 0.1)
    with pytest.raises(ValueError, match="^prox_logp has 3 non-finite values"):
        apply_m2po_masking(prox, old, m, 0.1)
    # the same values outside loss_mask are fine
    m2 = ~torch.isinf(old) & ~torch.isnan(old)
    assert apply_m2po_masking(old, prox, m2, 0.1).tolist() == m2.tolist()
    with pytest.raises(ValueError, match="non-finite"):
        m2po_keep_mask(torch.tensor([1.0, float("inf")]), 0.1)


def test_keep_mask_validation():
    with pytest.raises(ValueError, match="m2 must be 1-D"):
        m2po_keep_mask(torch.zeros(2, 2), 0.1)
    with pytest.raises(TypeError, match="m2 must be a floating-point tensor"):
        m2po_keep_mask(torch.zeros(3, dtype=torch.int64), 0.1)
    with pytest.raises(ValueError, match="method"):
        m2po_keep_mask(torch.zeros(3), 0.1, method="fast")


def test_m2po_stats_by_hand():
    # valid m2 = [0.5, 0.1, 0.05, 0.3] (one padded slot), threshold 0.2 -> 0.5 masked
    old = torch.tensor(
        [[math.sqrt(0.5), math.sqrt(0.1), 7.0], [math.sqrt(0.05), math.sqrt(0.3), 0.0]]
    )
    prox = torch.zeros(2, 3)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    keep = apply_m2po_masking(old, prox, mask, 0.2)
    assert keep.tolist() == [[False, True, False], [True, True, False]]
    m2 = m2_per_token(old, prox, mask)
    assert m2[0, 2].item() == 0.0
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
# Property tests
# ---------------------------------------------------------------------------------------

_SETTINGS = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# wide-range float32 values (sums are inexact in float64, thresholds drawn independently)
_wide_values = st.lists(
    st.floats(min_value=0.0, max_value=1e4, width=32, allow_subnormal=True),
    min_size=1,
    max_size=300,
)
_thresholds = st.floats(min_value=1e-6, max_value=1e4, allow_nan=False, allow_infinity=False)
# dyadic values (multiples of 1/64 below 64): all float64 sums exact, so thresholds can sit
# exactly on a prefix mean and ties are frequent
_dyadic_values = st.lists(st.integers(min_value=0, max_value=4095), min_size=1, max_size=200)


def _check_rule(m2: torch.Tensor, thr: float, keep: torch.Tensor) -> None:
    vals = m2.double()
    kept, dropped = vals[keep], vals[~keep]
    assert kept.numel() >= 1
    if kept.numel() > 1:
        assert float(kept.mean()) < thr * (1 + 1e-12) + 1e-300
    if dropped.numel():
        assert float(dropped.min()) >= float(kept.max())
        # dropping one fewer (adding back the smallest dropped) would leave mean >= thr
        back = (float(kept.sum()) + float(dropped.min())) / (kept.numel() + 1)
        assert back >= thr * (1 - 1e-12)
        # ties at the cut: a dropped copy of the largest kept value precedes every kept copy
        cut = float(kept.max())
        tie_dropped = ((vals == cut) & ~keep).nonzero().flatten()
        tie_kept = ((vals == cut) & keep).nonzero().flatten()
        if tie_dropped.numel() and tie_kept.numel():
            assert int(tie_dropped.max()) < int(tie_kept.min())


@_SETTINGS
@given(values=_wide_values, thr=_thresholds)
def test_property_wide_range(values, thr):
    m2 = torch.tensor(values, dtype=torch.float32)
    ref = m2po_keep_mask_sorted_reference(m2, thr)
    _check_rule(m2, thr, ref)
    for mth in METHODS:
        assert torch.equal(m2po_keep_mask(m2, thr, method=mth), ref)


@_SETTINGS
@given(ints=_dyadic_values, data=st.data())
def test_property_exact_boundaries_and_ties(ints, data):
    m2 = torch.tensor(ints, dtype=torch.float32) / 64
    srt = sorted(ints)
    k = data.draw(st.integers(min_value=1, max_value=len(srt)))
    # threshold exactly on the mean of the k smallest (or a hair above / below it)
    base = sum(srt[:k]) / 64 / k
    nudge = data.draw(st.sampled_from([0.0, 1e-9, -1e-9]))
    thr = base + nudge if base + nudge > 0 else 1e-9
    ref = m2po_keep_mask_sorted_reference(m2, thr)
    _check_rule(m2, thr, ref)
    for mth in METHODS:
        assert torch.equal(m2po_keep_mask(m2, thr, method=mth), ref)


@_SETTINGS
@given(
    values=st.lists(
        st.floats(min_value=-1e3, max_value=1e3, width=32, allow_subnormal=False),
        min_size=1,
        max_size=100,
    ),
    thr=_thresholds,
)
def test_property_signed_values_match_reference(values, thr):
    # m2 is a square in practice; the selection path still handles any finite floats
    m2 = torch.tensor(values, dtype=torch.float32)
    ref = m2po_keep_mask_sorted_reference(m2, thr)
    assert torch.equal(m2po_keep_mask(m2, thr, method="select"), ref)


@settings(max_examples=25, deadline=None, database=None)
@given(seed=st.integers(min_value=0, max_value=2**31 - 1), frac=st.floats(0.01, 0.99))
def test_property_large_random_inputs(seed, frac):
    g = _gen(seed)
    n = 5000 + seed % 5000
    m2 = (torch.randn(n, generator=g) * 0.5) ** 2
    srt, _ = torch.sort(m2)
    k = max(1, int(frac * n))
    thr = float(srt[:k].double().mean()) * (1 + 1e-6)
    ref = m2po_keep_mask_sorted_reference(m2, thr)
    _check_rule(m2, thr, ref)
    assert torch.equal(m2po_keep_mask(m2, thr, method="select"), ref)
    assert torch.equal(m2po_keep_mask(m2, thr), ref)


def test_apply_bf16_logprobs_upcast_to_float32():
    g = _gen(6)
    old = (-torch.rand(4, 300, generator=g) * 3).to(torch.bfloat16)
    prox = (old.float() + 0.3 * torch.randn(4, 300, generator=g)).to(torch.bfloat16)
    mask = torch.rand(4, 300, generator=g) < 0.9
    keep = apply_m2po_masking(old, prox, mask, 0.02)
    m2 = (old.float()[mask] - prox.float()[mask]) ** 2
    assert torch.equal(keep[mask], m2po_keep_mask_sorted_reference(m2, 0.02))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_sort_path_matches_cpu():
    g = _gen(7)
    old = -torch.rand(32, 1024, generator=g) * 3
    prox = old + torch.exp(torch.randn(32, 1024, generator=g) * 1.5 - 2.5)
    mask = torch.rand(32, 1024, generator=g) < 0.7
    cpu = apply_m2po_masking(old, prox, mask, 0.02)
    gpu = apply_m2po_masking(old.cuda(), prox.cuda(), mask.cuda(), 0.02)
    assert torch.equal(gpu.cpu(), cpu)
    m2 = ((old - prox)[mask]) ** 2
    assert torch.equal(m2po_keep_mask(m2.cuda(), 0.02).cpu(), m2po_keep_mask(m2, 0.02))
