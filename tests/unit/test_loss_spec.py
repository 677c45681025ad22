"""PPOLossSpec (the PPO loss options checked once), AReaL's rejection-sampling argument, the
choice lists defined once in api/cli_args.py and the one rule for rejection-sampling bounds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from areal_m2po.algo import aggregation, kl, m2po, normalization, ppo_loss
from areal_m2po.algo.ppo_loss import PPOLossSpec, ppo_actor_loss
from areal_m2po.algo.rejection_sampling import RejectionSampling, as_rejection_sampling
from areal_m2po.api import cli_args
from areal_m2po.api.cli_args import ActorConfig, ConfigError, RejectionSamplingConfig
from areal_m2po.api.config_loader import load_config
from areal_m2po.areal.utils.functional import ppo_actor_loss_fn
from areal_m2po.trainer.ppo.loss_fn import ppo_loss_spec

F64 = torch.float64


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(4, 6, generator=g, dtype=F64) * 0.3 - 1.0
    prox = lp + 0.2 * torch.randn(4, 6, generator=g, dtype=F64)
    old = prox + 0.3 * torch.randn(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, 6, generator=g, dtype=F64)
    mask = torch.rand(4, 6, generator=g) < 0.8
    m2po_mask = torch.rand(4, 6, generator=g) < 0.9
    return lp, prox, old, adv, mask, m2po_mask


def test_spec_from_actor_config():
    rs = RejectionSamplingConfig(upper=1.5)
    c = ActorConfig(eps_clip=0.1, eps_clip_higher=0.3, c_clip=2.0)
    spec = ppo_loss_spec(c, max_new_tokens=16)
    assert spec.rejection_sampling is None
    assert (spec.eps_clip, spec.eps_clip_upper, spec.c_clip) == (0.1, 0.3, 2.0)
    assert spec.max_tokens_norm == 16 and spec.loss_agg_mode == c.loss_agg_mode
    c2 = ActorConfig(use_decoupled_loss=True, rejection_sampling=rs)
    # the maths gets plain values: the section unpacked, every field carried over
    unpacked = ppo_loss_spec(c2, None).rejection_sampling
    assert unpacked == RejectionSampling("token", "mask", "ratio", "mean", 1.5, None)
    assert dataclasses.asdict(unpacked) == dataclasses.asdict(rs)
    assert PPOLossSpec(eps_clip=0.2).eps_clip_upper == 0.2
    with pytest.raises(AttributeError):
        spec.eps_clip = 0.5  # type: ignore[misc]


def test_spec_bad_options_name_the_culprit():
    with pytest.raises(ValueError, match="eps_clip must be >= 0"):
        PPOLossSpec(eps_clip=-0.1)
    with pytest.raises(ValueError, match="eps_clip_higher must be >= 0"):
        PPOLossSpec(eps_clip=0.2, eps_clip_higher=float("nan"))
    with pytest.raises(ValueError, match="c_clip must be > 1"):
        PPOLossSpec(eps_clip=0.2, c_clip=1.0)
    with pytest.raises(ValueError, match="importance_sampling_level"):
        PPOLossSpec(eps_clip=0.2, importance_sampling_level="seq")
    with pytest.raises(ValueError, match="loss_agg_mode"):
        PPOLossSpec(eps_clip=0.2, loss_agg_mode="mean")
    lp, prox, old, adv, mask, _ = _inputs(0)
    with pytest.raises(TypeError, match="eps_clip_hgher"):
        ppo_actor_loss_fn(lp, prox, old, adv, 0.2, mask, eps_clip_hgher=0.3)


def test_choice_lists_are_defined_once():
    assert aggregation.LOSS_AGG_MODES is cli_args.LOSS_AGG_MODES
    assert ppo_loss.LOSS_AGG_MODES is cli_args.LOSS_AGG_MODES
    assert kl.KL_ESTIMATORS is cli_args.KL_ESTIMATORS
    assert normalization.NORM_LEVELS is cli_args.NORM_LEVELS
    assert ppo_loss.IMPORTANCE_SAMPLING_LEVELS is cli_args.IMPORTANCE_SAMPLING_LEVELS
    fields = {f.name: f for f in dataclasses.fields(ActorConfig)}
    assert fields["loss_agg_mode"].metadata["choices"] is cli_args.LOSS_AGG_MODES
    assert fields["kl_estimator"].metadata["choices"] is cli_args.KL_ESTIMATORS
    assert fields["m2_token_set"].metadata["choices"] is m2po.TOKEN_SETS
    assert fields["importance_sampling_level"].metadata["choices"] is (
        cli_args.IMPORTANCE_SAMPLING_LEVELS
    )
    rs_fields = {f.name: f for f in dataclasses.fields(RejectionSamplingConfig)}
    assert rs_fields["metric"].metadata["choices"] is cli_args.REJECTION_METRICS
    assert rs_fields["action"].metadata["choices"] is cli_args.REJECTION_ACTIONS
    assert rs_fields["agg"].metadata["choices"] is cli_args.REJECTION_AGGS
    assert rs_fields["level"].metadata["choices"] is cli_args.IMPORTANCE_SAMPLING_LEVELS


def test_rejection_bounds_one_rule_lower_below_upper():
    # an empty interval (lower == upper) drops (nearly) every token: refused by the config and,
    # through the same rule, by the loss called directly with a mapping (was accepted there)
    with pytest.raises(ConfigError, match="lower: must be < upper"):
        RejectionSamplingConfig(lower=1.0, upper=1.0)
    lp, prox, old, adv, mask, _ = _inputs(1)
    with pytest.raises(ValueError, match="lower: must be < upper"):
        ppo_actor_loss_fn(
            lp, prox, old, adv, 0.2, mask, rejection_sampling={"lower": 1.0, "upper": 1.0}
        )
    with pytest.raises(ValueError, match="lower: must be < upper"):
        as_rejection_sampling({"lower": 2.0, "upper": 1.0})
    with pytest.raises(ValueError, match="^lower: must be < upper"):
        RejectionSampling(lower=1.0, upper=1.0)
    ok = as_rejection_sampling({"lower": 0.999, "upper": 1.0})
    assert isinstance(ok, RejectionSampling) and (ok.lower, ok.upper) == (0.999, 1.0)


def test_rejection_mapping_defaults_are_the_loss_defaults():
    # a mapping without "upper" has no upper bound (not the config file's default 2.0)
    cfg = as_rejection_sampling({"lower": 0.5})
    assert cfg is not None and cfg.upper is None and cfg.lower == 0.5
    assert (cfg.level, cfg.action, cfg.metric, cfg.agg) == ("token", "mask", "ratio", "mean")
    assert as_rejection_sampling(None) is None
    with pytest.raises(ValueError, match="at least one of upper/lower"):
        as_rejection_sampling({"level": "token"})
    with pytest.raises(ValueError, match="metric: must be one of"):
        as_rejection_sampling({"metric": "kl", "upper": 1.0})


def test_rejection_options_are_plain_values_not_the_config_section():
    # the maths refuses the config section (the actor unpacks it) and a misspelt field
    with pytest.raises(TypeError, match="RejectionSamplingConfig"):
        PPOLossSpec(eps_clip=0.2, rejection_sampling=RejectionSamplingConfig())
    with pytest.raises(TypeError, match="unknown field 'uper'"):
        as_rejection_sampling({"uper": 1.0})
    # AReaL's calling convention passes its config section: same loss as the unpacked values
    lp, prox, old, adv, mask, m2 = _inputs(4)
    section = RejectionSamplingConfig(level="sequence", action="clamp", lower=0.5, upper=1.5)
    la, _ = ppo_actor_loss_fn(lp, prox, old, adv, 0.2, mask, rejection_sampling=section)
    spec = PPOLossSpec(
        eps_clip=0.2,
        rejection_sampling=RejectionSampling("sequence", "clamp", upper=1.5, lower=0.5),
    )
    lb, _ = ppo_actor_loss(lp, prox, old, adv, mask, spec)
    assert torch.equal(la, lb)


def test_rejection_sampling_without_the_decoupled_loss_is_refused():
    """It bounds the decoupled loss's behaviour weight; without that loss it used to be
    accepted and then dropped silently."""
    rs = RejectionSamplingConfig(upper=1.5)
    with pytest.raises(ConfigError) as caught:
        ActorConfig(use_decoupled_loss=False, rejection_sampling=rs)
    assert caught.value.key == "rejection_sampling"
    assert "use_decoupled_loss=true or rejection_sampling=null" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert ActorConfig(use_decoupled_loss=True, rejection_sampling=rs).rejection_sampling == rs
    with pytest.raises(ConfigError, match=r"^actor\.rejection_sampling: bounds the behaviour"):
        load_config(["actor.use_decoupled_loss=false", "actor.rejection_sampling.upper=3"])
