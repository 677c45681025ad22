"""PPOActor owns the proximal log-probs and the M2PO mask: prepare_proximal (once per step),
prepare_m2po (global scope, once per minibatch), _m2po_mask (micro-batch scope, in the loss
path). A stub engine stands in for the model; nothing global is set."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from areal_m2po.algo.m2po import m2po_mask
from areal_m2po.api.cli_args import ActorConfig
from areal_m2po.trainer.ppo.actor import PPOActor


class StubEngine:
    """Counts forward passes; the "policy at step start" is behave + 0.5."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.forwards = 0

    def forward_tokens(self, batch, temperature):
        self.forwards += 1
        return batch["behave_logp"] + 0.5, None


def _batch(versions: list[int]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(len(versions), 5, dtype=torch.bool)
    mask[:, 0] = False
    return {
        "loss_mask": mask,
        "behave_logp": -torch.rand(len(versions), 5, generator=g),
        "versions": torch.tensor(versions)[:, None].expand(-1, 5).clone(),
    }


def _actor(version: int, exact_behave_logp: bool = True, **kwargs) -> PPOActor:
    return PPOActor(
        ActorConfig(**kwargs),
        StubEngine(version),  # type: ignore[arg-type]
        group_size=1,
        max_new_tokens=4,
        exact_behave_logp=exact_behave_logp,
    )


def test_prepare_proximal_on_policy_reuses_behaviour_stale_recomputes():
    actor = _actor(3, m2_threshold=0.04)
    batch = _batch([3, 3])
    actor.prepare_proximal(batch)
    assert batch["prox_logp"] is batch["behave_logp"] and actor.engine.forwards == 0
    batch = _batch([3, 2])
    actor.prepare_proximal(batch)
    assert actor.engine.forwards == 1
    assert torch.equal(batch["prox_logp"], batch["behave_logp"] + 0.5)


def test_prepare_proximal_of_an_inexact_engine_recomputes_and_logs_the_mismatch():
    """An engine whose log-probs are not the trainer's own: on-policy batches get the forward
    pass too, and the mismatch is taken over the tokens of the policy's version only (the stub
    policy is behave + 0.5: d = -0.5 on each of them)."""
    exact = _actor(3, m2_threshold=0.04)
    batch = _batch([3, 3])
    assert exact.prepare_proximal(batch) == {} and exact.engine.forwards == 0

    actor = _actor(3, m2_threshold=0.04, exact_behave_logp=False)
    batch = _batch([3, 3])
    stats = actor.prepare_proximal(batch)
    assert actor.engine.forwards == 1
    assert torch.equal(batch["prox_logp"], batch["behave_logp"] + 0.5)
    assert stats["rollout/logp_mismatch_tokens"] == 8  # 2 rows x 4 valid tokens
    assert stats["rollout/logp_mismatch_abs_mean"] == pytest.approx(0.5, abs=1e-6)
    assert stats["rollout/logp_mismatch_abs_max"] == pytest.approx(0.5, abs=1e-6)
    assert stats["rollout/logp_mismatch_kl"] == pytest.approx(math.exp(0.5) - 1.5, abs=1e-6)
    # mixed versions (exact engine or not): only the version-3 row counts
    stats = exact.prepare_proximal(_batch([3, 2]))
    assert stats["rollout/logp_mismatch_tokens"] == 4
    # no token of the policy's version: no figures
    assert exact.prepare_proximal(_batch([1, 2])) == {}


def test_prepare_proximal_without_recompute_is_behaviour_and_warns_once(caplog):
    actor = _actor(3, m2_threshold=0.04, recompute_logprob=False)
    with caplog.at_level(logging.WARNING, logger="areal_m2po.actor"):
        for _ in range(2):
            batch = _batch([1, 2])
            actor.prepare_proximal(batch)
            assert batch["prox_logp"] is batch["behave_logp"]
    assert actor.engine.forwards == 0
    assert [r.getMessage().count("cannot mask anything") for r in caplog.records] == [1]


def test_prepare_proximal_loglinear_does_not_warn(caplog):
    actor = _actor(
        3,
        m2_threshold=0.04,
        m2_scope="microbatch",
        use_decoupled_loss=True,
        prox_logp_method="loglinear",
    )
    batch = _batch([1, 2])
    with caplog.at_level(logging.WARNING, logger="areal_m2po.actor"):
        actor.prepare_proximal(batch)
    assert batch["prox_logp"] is batch["behave_logp"] and not caplog.records


def test_m2po_mask_per_scope():
    batch = _batch([2, 2])
    batch["prox_logp"] = batch["behave_logp"] + torch.linspace(0, 1, 10).view(2, 5)
    prox = batch["prox_logp"]
    want_keep, want_stats = m2po_mask(batch["behave_logp"], prox, batch["loss_mask"], 0.04)
    assert 0 < int(want_keep.sum()) < int(batch["loss_mask"].sum())

    micro = _actor(3, m2_threshold=0.04, m2_scope="microbatch")
    assert micro.prepare_m2po(batch) == {} and "m2po_mask" not in batch
    keep, stats = micro._m2po_mask(batch, prox)
    assert torch.equal(keep, want_keep)
    assert {k: float(v) for k, v in stats.items()} == {k: float(v) for k, v in want_stats.items()}

    glob = _actor(3, m2_threshold=0.04)
    with pytest.raises(KeyError, match="prepare_m2po"):
        glob._m2po_mask(batch, prox)
    stats = glob.prepare_m2po(batch)
    assert torch.equal(batch["m2po_mask"], want_keep)
    assert stats["m2po/n_masked"] == float(want_stats["m2po/n_masked"])
    keep, stats = glob._m2po_mask(batch, prox)  # the loss only reads it
    assert keep is batch["m2po_mask"] and stats == {}

    off = _actor(3)
    assert off.prepare_m2po(batch) == {} and off._m2po_mask(batch, prox) == (None, {})


@pytest.mark.parametrize("scope", ["global", "microbatch"])
def test_trust_region_token_set_reaches_the_rule_in_both_scopes(scope):
    batch = _batch([2, 2])
    batch["prox_logp"] = batch["behave_logp"] + torch.linspace(-1, 1, 10).view(2, 5)
    batch["advantages"] = torch.tensor([[1.0] * 5, [-1.0] * 5])
    prox = batch["prox_logp"]
    want_keep, _ = m2po_mask(
        batch["behave_logp"],
        prox,
        batch["loss_mask"],
        0.04,
        advantages=batch["advantages"],
        token_set="trust_region",
    )
    all_keep, _ = m2po_mask(batch["behave_logp"], prox, batch["loss_mask"], 0.04)
    assert not torch.equal(want_keep, all_keep)
    actor = _actor(3, m2_threshold=0.04, m2_scope=scope, m2_token_set="trust_region")
    stats = actor.prepare_m2po(batch)
    keep, mb_stats = actor._m2po_mask(batch, prox)
    stats = stats or {k: float(v) for k, v in mb_stats.items()}
    assert torch.equal(keep, want_keep)
    assert "m2po/trust_region_fraction" in stats
