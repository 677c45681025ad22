"""M2PO's trust-region token set (``actor.m2_token_set=trust_region``): hand-derived cases, an
independent per-token reference in exact arithmetic, ties, bad input, statistics, and the
global scope against the rule on the concatenated minibatch.

Reference, by the letter of the paper's final Algorithm 1 as Trinity-RFT PR #616 and ms-swift
PR #9965 describe it: the candidates are the valid tokens with ``A > 0 and r > 1`` or
``A < 0 and r < 1`` (``r = pi_prox / pi_behave``); drop the candidate with the largest m2 (among
equal values the smaller flat index first) one at a time while the exact mean m2 of the
remaining candidates is not below the threshold, keeping at least one; every other valid token
is kept.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from areal_m2po.algo.m2po import m2po_mask, trust_region_tokens
from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking
from areal_m2po.trainer.ppo.actor import global_m2po_mask


def reference_trust_region(
    behave: list[float], prox: list[float], adv: list[float], valid: list[bool], thr: float
) -> tuple[list[bool], list[bool]]:
    """(keep, in_region) over flat per-token lists, one token at a time, in Fractions."""
    in_region = [
        v and ((a > 0 and p > b) or (a < 0 and p < b))
        for b, p, a, v in zip(behave, prox, adv, valid, strict=True)
    ]
    m2 = [(Fraction(b) - Fraction(p)) ** 2 for b, p in zip(behave, prox, strict=True)]
    cand = [i for i, r in enumerate(in_region) if r]
    keep = list(valid)
    order = sorted(cand, key=lambda i: (-m2[i], i))
    total, n, t = sum(m2[i] for i in cand), len(cand), Fraction(thr)
    for i in order:
        if n <= 1 or total < t * n:
            break
        keep[i] = False
        total -= m2[i]
        n -= 1
    return keep, in_region


def _grid(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def _mb(behave, prox, valid, adv=None) -> dict[str, torch.Tensor]:
    """A minibatch as :func:`global_m2po_mask` reads it."""
    mb = {"behave_logp": behave, "prox_logp": prox, "loss_mask": valid}
    return mb if adv is None else {**mb, "advantages": adv}


def test_hand_case_masks_only_in_quadrant_tokens():
    # 1 x 6 tokens, behave 0 everywhere, so m2 = prox^2 and r > 1 <=> prox > 0
    behave = _grid([[0.0] * 6])
    prox = _grid([[1.0, -1.0, 0.5, -0.5, 2.0, 0.0]])
    adv = _grid([[1.0, 1.0, -1.0, -1.0, 0.0, 1.0]])
    valid = torch.ones(1, 6, dtype=torch.bool)
    # quadrants: t0 (A>0, r>1), t3 (A<0, r<1); t1/t2 on the safe side, t4 A=0, t5 r=1
    assert trust_region_tokens(behave, prox, adv, valid).tolist() == [
        [True, False, False, True, False, False]
    ]
    # candidates' m2 [1, 0.25]: mean 0.625 >= 0.3 -> drop t0 (m2 1); mean 0.25 < 0.3 -> stop.
    # The all-token rule would drop t4 (m2 4) and t0/t1 (1, 1) instead.
    keep, stats = m2po_mask(behave, prox, valid, 0.3, advantages=adv, token_set="trust_region")
    assert keep.tolist() == [[False, True, True, True, True, True]]
    assert stats["m2po/n_masked"].item() == 1
    assert stats["m2po/trust_region_fraction"].item() == pytest.approx(2 / 6)
    assert stats["m2po/m2_before_trust_region"].item() == pytest.approx(0.625)
    assert stats["m2po/m2_after_trust_region"].item() == pytest.approx(0.25)
    # all-token m2 [1, 1, .25, .25, 4, 0] mean 1.083: drop 4, 1, 1 -> [.25, .25, 0] mean 1/6
    keep_all, stats_all = m2po_mask(behave, prox, valid, 0.3, advantages=adv)
    assert keep_all.tolist() == [[False, False, True, True, False, True]]
    assert torch.equal(keep_all, _apply_m2po_masking(behave, prox, valid, 0.3))
    assert stats_all["m2po/m2_before"].item() == pytest.approx(6.5 / 6)
    # the quadrant stats are reported for the all-token set too (same quadrants)
    assert stats_all["m2po/trust_region_fraction"].item() == pytest.approx(2 / 6)
    assert stats_all["m2po/m2_after_trust_region"].item() == pytest.approx(0.25)


def test_keeps_at_least_one_candidate_and_ties_go_by_index():
    behave = torch.zeros(1, 4)
    prox = torch.full((1, 4), 1.0)  # r > 1 everywhere, m2 = 1 each
    adv = torch.ones(1, 4)
    valid = torch.ones(1, 4, dtype=torch.bool)
    keep, _ = m2po_mask(behave, prox, valid, 0.5, advantages=adv, token_set="trust_region")
    assert keep.tolist() == [[False, False, False, True]]


def test_no_candidates_masks_nothing():
    behave = torch.zeros(2, 3)
    prox = torch.full((2, 3), -3.0)  # r < 1 everywhere
    adv = torch.ones(2, 3)  # A > 0: the safe side everywhere
    valid = torch.tensor([[True, True, False], [True, False, False]])
    keep, stats = m2po_mask(behave, prox, valid, 0.04, advantages=adv, token_set="trust_region")
    assert torch.equal(keep, valid)
    assert stats["m2po/masked_fraction"].item() == 0
    assert stats["m2po/trust_region_fraction"].item() == 0
    assert stats["m2po/m2_before"].item() == pytest.approx(9.0)


@pytest.mark.parametrize("seed", range(12))
def test_random_batches_match_the_reference(seed):
    g = torch.Generator().manual_seed(seed)
    b, t = 5, 37
    behave = -torch.rand(b, t, generator=g) * 4
    prox = behave + torch.randn(b, t, generator=g) * (0.05 + 0.5 * (seed % 3))
    # ties in m2 and exact r = 1 on some tokens
    prox[:, :3] = behave[:, :3]
    prox[0, 5:9] = behave[0, 5:9] + 0.25
    adv = torch.randn(b, t, generator=g).round()  # many exact zeros
    valid = torch.rand(b, t, generator=g) < 0.8
    thr = [0.001, 0.04, 0.3][seed % 3]
    keep, _ = m2po_mask(behave, prox, valid, thr, advantages=adv, token_set="trust_region")
    want_keep, want_region = reference_trust_region(
        behave.flatten().tolist(),
        prox.flatten().tolist(),
        adv.flatten().tolist(),
        valid.flatten().tolist(),
        thr,
    )
    assert keep.flatten().tolist() == want_keep
    assert trust_region_tokens(behave, prox, adv, valid).flatten().tolist() == want_region
    # global scope in one process: the same mask and the same stats as the micro-batch path
    keep_g, stats_g = global_m2po_mask(_mb(behave, prox, valid, adv), thr, "trust_region")
    assert torch.equal(keep_g, keep)
    _, stats_mb = m2po_mask(behave, prox, valid, thr, advantages=adv, token_set="trust_region")
    assert stats_g.keys() == {k for k in stats_mb}
    for k, v in stats_mb.items():
        assert stats_g[k] == pytest.approx(v.item(), rel=1e-6, abs=1e-12), k


@pytest.mark.parametrize("token_set", ["all", "trust_region"])
def test_gathered_ranks_get_the_rule_of_the_concatenated_batch(token_set):
    """``m2po_mask(gather=...)`` on each of two ranks' rows (uneven: 2 and 3 rows) gives the
    rows of the mask of the whole batch and its stats."""
    g = torch.Generator().manual_seed(11)
    behave = -torch.rand(5, 23, generator=g) * 3
    prox = behave + 0.4 * torch.randn(5, 23, generator=g)
    adv = torch.randn(5, 23, generator=g).round()
    valid = torch.rand(5, 23, generator=g) < 0.8
    shares = [slice(0, 2), slice(2, 5)]
    sent: list[torch.Tensor] = []

    def record(t: torch.Tensor) -> tuple[list[torch.Tensor], int]:
        sent.append(t)
        return [t], 0

    for rows in shares:  # what each rank puts into the collective
        args = (behave[rows], prox[rows], valid[rows], 0.04)
        m2po_mask(*args, advantages=adv[rows], token_set=token_set, gather=record)
    want_keep, want_stats = m2po_mask(
        behave, prox, valid, 0.04, advantages=adv, token_set=token_set, stats_dtype=torch.float64
    )
    for rank, rows in enumerate(shares):
        keep, stats = m2po_mask(
            behave[rows],
            prox[rows],
            valid[rows],
            0.04,
            advantages=adv[rows],
            token_set=token_set,
            gather=lambda t, rank=rank: (sent[-2:], rank),
            stats_dtype=torch.float64,
        )
        assert torch.equal(keep, want_keep[rows]), rank
        assert stats.keys() == want_stats.keys()
        for k, v in want_stats.items():
            assert torch.equal(stats[k], v), (rank, k)
    assert 0 < want_stats["m2po/n_masked"] < want_stats["m2po/n_valid"]


def test_global_all_token_set_unchanged_by_the_advantages():
    g = torch.Generator().manual_seed(3)
    behave = -torch.rand(4, 20, generator=g) * 3
    prox = behave + 0.3 * torch.randn(4, 20, generator=g)
    adv = torch.randn(4, 20, generator=g)
    valid = torch.rand(4, 20, generator=g) < 0.8
    keep_plain, stats_plain = global_m2po_mask(_mb(behave, prox, valid), 0.04)
    keep_adv, stats_adv = global_m2po_mask(_mb(behave, prox, valid, adv), 0.04, "all")
    assert torch.equal(keep_plain, keep_adv)
    assert torch.equal(keep_plain, _apply_m2po_masking(behave, prox, valid, 0.04))
    for k, v in stats_plain.items():
        assert stats_adv[k] == v, k
    assert "m2po/trust_region_fraction" in stats_adv
    assert "m2po/trust_region_fraction" not in stats_plain


def test_bad_input_is_refused_with_the_culprit_named():
    behave = torch.zeros(1, 3)
    prox = torch.zeros(1, 3)
    valid = torch.ones(1, 3, dtype=torch.bool)
    adv = torch.tensor([[1.0, math.nan, 0.0]])
    with pytest.raises(ValueError, match="advantages has 1 non-finite"):
        m2po_mask(behave, prox, valid, 0.04, advantages=adv, token_set="trust_region")
    # NaN outside the valid tokens is ignored
    keep, _ = m2po_mask(
        behave,
        prox,
        torch.tensor([[True, False, True]]),
        0.04,
        advantages=adv,
        token_set="trust_region",
    )
    assert keep.tolist() == [[True, False, True]]
    with pytest.raises(ValueError, match="needs the advantages"):
        m2po_mask(behave, prox, valid, 0.04, token_set="trust_region")
    with pytest.raises(ValueError, match="token_set must be one of"):
        m2po_mask(behave, prox, valid, 0.04, advantages=torch.zeros(1, 3), token_set="quadrants")
    with pytest.raises(ValueError, match="prox_logp has 1 non-finite"):
        m2po_mask(
            behave,
            torch.tensor([[0.0, math.inf, 0.0]]),
            valid,
            0.04,
            advantages=torch.ones(1, 3),
            token_set="trust_region",
        )
    with pytest.raises(ValueError, match="advantages shape"):
        trust_region_tokens(behave, prox, torch.zeros(2, 3), valid)
    with pytest.raises(TypeError, match="advantages must be a floating-point"):
        trust_region_tokens(behave, prox, torch.zeros(1, 3, dtype=torch.long), valid)


def test_config_key_and_its_choices():
    from areal_m2po.api.cli_args import ActorConfig, ConfigError

    assert ActorConfig().m2_token_set == "all"
    assert ActorConfig(m2_threshold=0.04, m2_token_set="trust_region").m2_token_set == (
        "trust_region"
    )
    with pytest.raises(ConfigError, match="m2_token_set"):
        ActorConfig(m2_token_set="quadrants")
