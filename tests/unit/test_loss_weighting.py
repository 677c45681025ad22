"""The loss weight of a micro-batch and its aggregation's denominator agree, in every mode.

The engine scales each micro-batch's loss by ``weight / total_weight``; the sum is the loss of
the whole minibatch only when the weight is exactly the count the aggregation divides by
(``agg_loss_weight``). Then the gradient depends neither on the micro-batch split nor on
``skip_zero_adv_seqs`` leaving zero-advantage rows out of the forward pass, also when some rows
have no valid token at all (truncated rows under ``overlong_filtering``).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from actors import tiny_actor

from areal_m2po.algo.aggregation import agg_loss, agg_loss_weight
from areal_m2po.api.cli_args import LOSS_AGG_MODES, MicroBatchSpec

F64 = torch.float64


# -- the pure functions -------------------------------------------------------------------------


def test_agg_loss_weight_by_hand():
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    assert int(agg_loss_weight(mask, "token-mean")) == 3
    assert int(agg_loss_weight(mask, "seq-mean-token-mean")) == 2
    assert int(agg_loss_weight(mask, "seq-mean-token-sum-norm")) == 2
    assert int(agg_loss_weight(torch.tensor([True, False, True]), "token-mean")) == 2
    assert int(agg_loss_weight(torch.zeros(2, 3, dtype=torch.bool), "seq-mean-token-mean")) == 0


def test_agg_loss_weight_bad_input():
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(TypeError, match="loss_mask must be torch.bool"):
        agg_loss_weight(mask.float(), "token-mean")
    with pytest.raises(ValueError, match="needs a \\[B, T\\] loss_mask"):
        agg_loss_weight(torch.ones(3, dtype=torch.bool), "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss_weight(mask, "sum")


def test_dr_grpo_divides_by_rows_with_a_valid_token():
    """Row 1 has no valid token: it is no sample of the loss, so it is not in the denominator."""
    tl = torch.tensor([[1.0, 2.0, 3.0], [5.0, 7.0, 9.0], [4.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    loss = agg_loss(tl, mask, mask, "seq-mean-token-sum-norm", max_tokens_norm=10)
    assert loss.item() == pytest.approx((1 + 2 + 4) / (2 * 10))
    # the other modes, by hand, for the same batch
    assert agg_loss(tl, mask, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert agg_loss(tl, mask, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    # nothing valid: 0, not a division by zero
    none = torch.zeros_like(mask)
    for mode in LOSS_AGG_MODES:
        assert agg_loss(tl, none, none, mode).item() == 0.0


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_is_additive_over_row_blocks(mode):
    """``sum_blocks agg_loss(block) * weight(block) / weight(batch) == agg_loss(batch)`` for
    random splits into row blocks, with fully masked rows, zero-loss rows left out of the
    blocks (what skip_zero_adv_seqs does), and a keep mask (M2PO) inside the loss mask."""
    g = torch.Generator().manual_seed(7)
    for trial in range(50):
        b, t = 12, 9
        lengths = torch.randint(0, t + 1, (b,), generator=g)
        lengths[torch.randperm(b, generator=g)[:3]] = 0  # rows without a valid token
        mask = torch.arange(t)[None, :] < lengths[:, None]
        keep = mask & (torch.rand(b, t, generator=g) > 0.2)
        tl = torch.randn(b, t, generator=g, dtype=F64)
        zero_rows = torch.rand(b, generator=g) < 0.3
        tl[zero_rows] = 0.0
        whole = agg_loss(tl, keep, mask, mode, max_tokens_norm=16)
        total = float(agg_loss_weight(mask, mode))
        # blocks of a random permutation; zero-loss rows are dropped from them
        order = torch.randperm(b, generator=g)
        cuts = sorted(torch.randint(1, b, (3,), generator=g).tolist())
        summed = torch.zeros((), dtype=F64)
        for block in torch.tensor_split(order, cuts):
            block = block[~zero_rows[block]]
            if block.numel() == 0:
                continue
            part = agg_loss(tl[block], keep[block], mask[block], mode, max_tokens_norm=16)
            summed = summed + part * float(agg_loss_weight(mask[block], mode)) / max(total, 1.0)
        torch.testing.assert_close(summed, whole, rtol=1e-12, atol=1e-12, msg=f"trial {trial}")


# -- one PPO update of the tiny model -----------------------------------------------------------

GROUP = 4
TRUNCATED_ROWS = [0, 3, 5, 9, 14]  # taken out of the loss mask by overlong_filtering
EQUAL_GROUP = 2  # rows 8..11 share one reward: zero advantages
SCOPES = {"global": dict(m2_scope="global"), "microbatch": dict(m2_scope="microbatch"), "off": {}}


def make_actor(loss_agg_mode: str, scope: str):
    m2 = {"m2_threshold": 0.04, **SCOPES[scope]} if SCOPES[scope] else {}
    return tiny_actor(GROUP, 8, loss_agg_mode=loss_agg_mode, **m2)


def make_batch(actor) -> dict[str, torch.Tensor]:
    """16 ragged rows (4 groups of 4), 5 truncated, one group with equal rewards, behaviour
    log-probs noisier than the proximal ones (M2PO masks some tokens); advantages filled."""
    from multiproc_worker import build_global_batch

    batch = build_global_batch(int(actor.engine.unwrapped.config.vocab_size))
    noise = batch.pop("_noise")
    batch["no_eos"][TRUNCATED_ROWS] = True
    batch["rewards"][EQUAL_GROUP * GROUP : (EQUAL_GROUP + 1) * GROUP] = 0.5
    batch["prox_logp"] = actor.compute_logp(batch)
    batch["behave_logp"] = (batch["prox_logp"] + noise) * batch["loss_mask"]
    actor.compute_advantages(batch)
    return batch


def update(actor, batch, initial, n_mbs: int, skip: bool) -> tuple[dict, dict[str, float]]:
    """One ppo_update from the ``initial`` weights; returns (weight change, stats)."""
    cfg = dataclasses.replace(
        actor.config, mb_spec=MicroBatchSpec(n_mbs=n_mbs), skip_zero_adv_seqs=skip
    )
    actor.config = actor.engine.config = cfg
    actor.engine.unwrapped.load_state_dict(initial)
    stats = actor.ppo_update(copy.deepcopy(batch))
    after = actor.engine.unwrapped.state_dict()
    return {k: after[k] - initial[k] for k in initial}, stats


def assert_same_update(delta, ref, what: str) -> None:
    for name, d in ref.items():
        torch.testing.assert_close(delta[name], d, rtol=1e-4, atol=1e-6, msg=f"{what}: {name}")


@pytest.mark.parametrize("scope", sorted(SCOPES))
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_update_independent_of_split_and_skipping(mode, scope):
    """The weights after one SGD step (lr 1: the change is minus the gradient) equal the
    single-micro-batch, no-skipping reference for n_mbs 1, 2, 4 and skipping on and off.

    With ``m2_scope=microbatch`` the M2PO statistic is taken per micro-batch (AReaL's rule),
    so the masked tokens, and the gradient, depend on the split by design; skipping is never
    applied in that scope (the statistic needs every row). There the invariant compared is
    skipping on == off at each n_mbs, and n_mbs=1 (one micro-batch holds the minibatch) ==
    the global scope's reference.
    """
    actor = make_actor(mode, scope)
    batch = make_batch(actor)
    # the premise: rows without a valid token, and zero-advantage rows with valid tokens
    valid_rows = batch["loss_mask"].any(-1)
    assert int((~valid_rows).sum()) == len(TRUNCATED_ROWS)
    zero_adv = valid_rows & ~((batch["advantages"] != 0) & batch["loss_mask"]).any(-1)
    assert int(zero_adv.sum()) >= 3
    initial = copy.deepcopy(actor.engine.unwrapped.state_dict())
    ref, ref_stats = update(actor, batch, initial, n_mbs=1, skip=False)
    assert max(float(d.abs().max()) for d in ref.values()) > 1e-4
    if scope != "off":
        assert 0 < ref_stats["m2po/masked_fraction"] < 1
    for n_mbs in (1, 2, 4):
        per_skip = {}
        for skip in (False, True):
            delta, stats = update(actor, batch, initial, n_mbs, skip)
            assert stats["actor/skipped_steps"] == 0 and stats["actor/empty_steps"] == 0
            if skip and scope != "microbatch":
                assert stats["actor/skipped_zero_adv_seqs"] >= len(TRUNCATED_ROWS) + 3
            per_skip[skip] = delta
            if scope != "microbatch":
                assert_same_update(delta, ref, f"n_mbs={n_mbs} skip={skip}")
        assert_same_update(per_skip[True], per_skip[False], f"n_mbs={n_mbs} skip on vs off")
    if scope == "microbatch":
        global_actor = make_actor(mode, "global")
        global_ref, _ = update(global_actor, batch, initial, n_mbs=1, skip=False)
        assert_same_update(ref, global_ref, "microbatch n_mbs=1 vs global")
