"""The start-up check of which trust region can act (areal_m2po/trainer/ppo/trust_region.py).

Each combination of the keys that decide it (ratio reference, minibatches, decoupled loss,
behaviour weight, SAPO, clip range, lag), with the lines expected by reading the loss code:
``algo/ppo_loss.py`` takes the ratio against ``prox_logp``, which ``PPOActor.prepare_proximal``
sets to a forward pass at the step's start (``recompute_logprob``) or to the behaviour
log-probs; with one minibatch the loss is evaluated at that very policy.
"""

from __future__ import annotations

import pytest

from areal_m2po.api.cli_args import ActorConfig, RejectionSamplingConfig, RolloutConfig
from areal_m2po.trainer.ppo.trust_region import NO_CLIP_RANGE, max_lag, trust_region_warnings

# the recipes, as actor keys
CLIP_VS_BEHAVE = dict(recompute_logprob=False, use_decoupled_loss=False)
CLIP_VS_PROX = dict(recompute_logprob=True, use_decoupled_loss=False, m2_threshold=0.04)
DECOUPLED = dict(recompute_logprob=True, use_decoupled_loss=True, m2_threshold=0.04)
SAPO_VS_PROX = dict(use_sapo_loss=True, recompute_logprob=True, m2_threshold=0.04)
SAPO_VS_BEHAVE = dict(use_sapo_loss=True, recompute_logprob=False)


def _lines(lag: int = 1, **actor: object) -> list[str]:
    return trust_region_warnings(ActorConfig(**actor), lag)


@pytest.mark.parametrize(
    "keys", [CLIP_VS_BEHAVE, CLIP_VS_PROX, DECOUPLED, SAPO_VS_PROX, SAPO_VS_BEHAVE]
)
def test_on_policy_data_gives_no_line(keys):
    assert _lines(0, **keys) == []
    assert _lines(0, ppo_n_minibatches=4, **keys) == []


@pytest.mark.parametrize(
    "keys", [CLIP_VS_BEHAVE, CLIP_VS_PROX, DECOUPLED, SAPO_VS_PROX, SAPO_VS_BEHAVE]
)
def test_several_minibatches_give_no_line(keys):
    """From the second minibatch on the policy has moved: every clip and gate can act."""
    assert _lines(4, ppo_n_minibatches=2, **keys) == []


@pytest.mark.parametrize("keys", [CLIP_VS_BEHAVE, SAPO_VS_BEHAVE])
def test_ratio_against_the_behaviour_policy_gives_no_line(keys):
    assert _lines(1, **keys) == []
    assert _lines(16, **keys) == []


def test_clip_against_the_proximal_policy_without_correction_warns():
    (line,) = _lines(2, **CLIP_VS_PROX)
    assert line.startswith("the PPO clip (actor.eps_clip=0.2) cannot act: ")
    assert "actor.ppo_n_minibatches=1 and actor.recompute_logprob=true" in line
    assert "rollouts up to 2 versions stale train an uncorrected policy gradient" in line
    assert "(only the M2PO mask acts)" in line
    # the three ways out, each by its key
    for key in (
        "actor.recompute_logprob=false",
        "actor.use_decoupled_loss=true",
        "actor.ppo_n_minibatches>1",
    ):
        assert key in line
    assert "\n" not in line


def test_without_m2po_the_line_does_not_mention_it():
    (line,) = _lines(1, recompute_logprob=True, use_decoupled_loss=False)
    assert "M2PO mask" not in line and "1 version stale" in line


def test_decoupled_loss_says_the_behaviour_weight_corrects():
    (line,) = _lines(4, **DECOUPLED)
    assert line.startswith("the PPO clip (actor.eps_clip=0.2) does not act: ")
    assert "the behaviour weight pi_prox/pi_behave corrects instead, with the M2PO mask" in line
    assert "actor.ppo_n_minibatches>1" in line
    assert f"actor.eps_clip={NO_CLIP_RANGE:g}" in line
    assert "uncorrected" not in line


def test_decoupled_loss_with_rejection_sampling_names_the_bound():
    rs = RejectionSamplingConfig(level="token", action="mask", metric="ratio", upper=5.0)
    (line,) = _lines(2, rejection_sampling=rs, **DECOUPLED)
    assert "(bounded by actor.rejection_sampling) corrects" in line


def test_decoupled_loss_without_behaviour_weight_is_uncorrected():
    """use_behave_imp_weight=false without rejection sampling is AReaL's decoupled loss: no
    behaviour weight, so nothing corrects the stale batch."""
    (line,) = _lines(1, use_behave_imp_weight=False, **DECOUPLED)
    assert "cannot act" in line and "uncorrected policy gradient" in line
    assert "actor.use_behave_imp_weight=true" in line
    assert "actor.use_decoupled_loss=true" not in line  # already on


def test_sapo_gate_against_the_proximal_policy_warns():
    (line,) = _lines(1, **SAPO_VS_PROX)
    assert line.startswith("the SAPO gate (actor.use_sapo_loss=true) cannot act: ")
    assert "actor.recompute_logprob=false" in line and "actor.ppo_n_minibatches>1" in line
    # SAPO refuses the decoupled loss: not offered
    assert "use_decoupled_loss" not in line and "use_behave_imp_weight" not in line


def test_loglinear_proximal_is_the_current_policy_at_the_first_minibatch():
    """prox_logp_method=loglinear interpolates with weight 1 at minibatch 0: the ratio is 1
    there even without a recompute."""
    keys = dict(
        prox_logp_method="loglinear",
        use_decoupled_loss=True,
        recompute_logprob=False,
        m2_threshold=0.04,
        m2_scope="microbatch",
    )
    (line,) = _lines(2, **keys)
    assert "actor.prox_logp_method=loglinear" in line and "does not act" in line
    (line,) = _lines(2, use_behave_imp_weight=False, **keys)
    assert "cannot act" in line and "actor.use_behave_imp_weight=true" in line
    assert "actor.recompute_logprob=false" not in line


def test_a_clip_out_of_reach_is_no_clip():
    """The study's M2PO arm writes eps_clip=1e6: nothing to warn about."""
    assert _lines(16, eps_clip=1e6, **DECOUPLED) == []
    assert _lines(16, eps_clip=NO_CLIP_RANGE, **CLIP_VS_PROX) == []
    # one side in reach is a clip
    (line,) = _lines(16, eps_clip=1e6, eps_clip_higher=0.28, **DECOUPLED)
    assert "actor.eps_clip=1e+06, actor.eps_clip_higher=0.28" in line
    # the dual clip is a trust region too, inert at a ratio of 1
    (line,) = _lines(16, eps_clip=1e6, c_clip=3.0, **CLIP_VS_PROX)
    assert "actor.c_clip=3" in line and "cannot act" in line


def test_zero_width_clip_warns_whatever_the_lag_and_minibatches():
    for lag, n_mb in [(0, 1), (0, 4), (2, 4)]:
        (line,) = _lines(lag, eps_clip=0.0, ppo_n_minibatches=n_mb, **CLIP_VS_BEHAVE)
        assert line.startswith("actor.eps_clip=0: a zero-width clip drops the gradient")
    (line,) = _lines(0, eps_clip=0.2, eps_clip_higher=0.0, **DECOUPLED)
    assert line.startswith("actor.eps_clip_higher=0: ")
    # and with the inert-clip line when both apply (AReaL's gsm8k_m2po settings)
    lines = _lines(2, eps_clip=0.0, **DECOUPLED)
    assert len(lines) == 2 and "does not act" in lines[1]


def test_custom_loss_gives_no_line():
    assert _lines(4, loss_fn="my_pkg.losses:my_loss", **CLIP_VS_PROX) == []
    assert _lines(4, loss_fn="my_pkg.losses:my_loss", eps_clip=0.0) == []


def test_max_lag():
    assert max_lag(RolloutConfig(staleness=3)) == 3
    assert max_lag(RolloutConfig(staleness=0)) == 0
    assert max_lag(RolloutConfig(staleness=2, max_head_offpolicyness=5)) == 2  # sync: exact
    assert max_lag(RolloutConfig(mode="async", max_head_offpolicyness=2)) == 2
    assert max_lag(RolloutConfig(mode="async")) == 0
