"""The actor's plan (trainer/ppo/plan.py): each choice decided once from the actor section and
what the trainer knows, its start-up line, the refused contradiction; and the one-time log line
of the training split's shared-prefix fallback (engine/checked_forward.py)."""

from __future__ import annotations

import logging

import pytest
import torch

from areal_m2po.api.cli_args import (
    ActorConfig,
    ConfigError,
    MicroBatchSpec,
    RejectionSamplingConfig,
)
from areal_m2po.engine.checked_forward import CheckedForwards
from areal_m2po.trainer.ppo.plan import resolve_actor_plan


def _plan(**kw):
    flags = {k: kw.pop(k) for k in ("exact_behave_logp", "prox_read_before_update") if k in kw}
    custom = kw.pop("custom_loss", None)
    return resolve_actor_plan(ActorConfig(**kw), 16, custom_loss=custom, **flags)


@pytest.mark.parametrize(
    ("kw", "loss", "correction"),
    [
        ({}, "ppo_clip", "none"),
        ({"c_clip": 3.0}, "dual_clip", "none"),
        ({"importance_sampling_level": "sequence"}, "gspo", "none"),
        (
            {"importance_sampling_level": "sequence", "use_decoupled_loss": True},
            "gspo",
            "behave_weight",
        ),
        ({"use_decoupled_loss": True, "c_clip": 3.0}, "decoupled", "behave_weight"),
        ({"use_decoupled_loss": True, "use_behave_imp_weight": False}, "decoupled", "none"),
        (
            {"use_decoupled_loss": True, "rejection_sampling": RejectionSamplingConfig(upper=2.0)},
            "decoupled",
            "rejection_sampling",
        ),
        ({"use_sapo_loss": True}, "sapo", "none"),
        (
            {
                "use_cispo_loss": True,
                "use_decoupled_loss": True,
                "eps_clip": 1.0,
                "eps_clip_higher": 4.0,
            },
            "cispo",
            "behave_weight",
        ),
    ],
)
def test_the_loss_and_its_behaviour_correction(kw, loss, correction):
    plan = _plan(**kw)
    assert (plan.loss, plan.correction, plan.custom_loss) == (loss, correction, None)
    assert plan.mode == loss
    assert (plan.ppo_spec is None) == (loss == "sapo")  # SAPO takes no clipped-PPO options
    if plan.ppo_spec is not None:
        assert plan.ppo_spec.max_tokens_norm == 16
        has_rs = plan.ppo_spec.rejection_sampling is not None
        assert has_rs == (correction == "rejection_sampling")


def test_a_custom_loss_keeps_the_library_choice_it_may_call():
    plan = _plan(use_sapo_loss=True, custom_loss="my.mod:loss")
    assert (plan.loss, plan.custom_loss, plan.mode) == ("sapo", "my.mod:loss", "custom")
    assert plan.describe().startswith("loss=custom my.mod:loss;")


@pytest.mark.parametrize(
    ("kw", "source", "reuse", "from_update"),
    [
        ({}, "recompute", True, True),
        ({"exact_behave_logp": False}, "recompute", False, True),
        ({"prox_read_before_update": True}, "recompute", True, False),
        ({"ppo_n_minibatches": 2}, "recompute", True, False),
        ({"kl_ctl": 0.1}, "recompute", True, False),  # the KL reward reads them first
        ({"kl_ctl": 0.1, "kl_logp": "behave"}, "recompute", True, True),
        ({"m2_threshold": 0.04}, "recompute", True, False),  # global mask: read first
        ({"m2_threshold": 0.04, "m2_scope": "microbatch"}, "recompute", True, True),
        ({"recompute_logprob": False}, "behave", False, False),
        (
            {"prox_logp_method": "loglinear", "use_decoupled_loss": True},
            "loglinear",
            False,
            False,
        ),
    ],
)
def test_the_proximal_source(kw, source, reuse, from_update):
    plan = _plan(**kw)
    assert (plan.prox_source, plan.prox_reuse_behave, plan.prox_from_update) == (
        source,
        reuse,
        from_update,
    )


def test_m2po_scope_and_the_inert_case():
    assert _plan().m2po == "off" and not _plan().m2po_on and _plan().m2po_text() == "off"
    glob = _plan(m2_threshold=0.04)
    assert (glob.m2po, glob.m2_threshold, glob.m2po_inert) == ("global", 0.04, False)
    assert glob.m2po_text() == "m2_threshold=0.04 (global)"  # the trainer's start-up words
    micro = _plan(m2_threshold=0.05, m2_scope="microbatch", m2_token_set="trust_region")
    assert (micro.m2po, micro.m2_token_set) == ("microbatch", "trust_region")
    inert = _plan(m2_threshold=0.04, recompute_logprob=False)
    assert inert.m2po_inert and "(inert)" in inert.describe()


def test_the_start_up_line():
    plan = _plan(use_decoupled_loss=True, m2_threshold=0.04, c_clip=3.0)
    assert plan.describe() == (
        "loss=decoupled (token-level ratio, c_clip=3.0); proximal=recompute (reusing "
        "behaviour log-probs on on-policy batches); M2PO=m2_threshold=0.04 (global), "
        "tokens=all; behaviour correction=behave_weight"
    )
    plain = _plan(exact_behave_logp=False, prox_read_before_update=True, kl_ctl=0.1)
    assert "proximal=recompute (every step)" in plain.describe()


def test_rejection_sampling_without_the_decoupled_loss_is_refused():
    """The loss would drop it silently; refused in one line naming the keys."""
    with pytest.raises(ConfigError, match="rejection_sampling") as err:
        _plan(rejection_sampling=RejectionSamplingConfig(upper=2.0))
    assert "\n" not in str(err.value)


class _NoAutocast:
    def autocast(self):
        return torch.autocast("cpu", enabled=False)


def test_the_training_split_says_its_plain_fallback_once(caplog):
    """shared_prefix_train on, gradient checkpointing: the plain split, said once."""
    spec = MicroBatchSpec(shared_prefix=True, shared_prefix_train=True)
    checks = CheckedForwards(spec, False, torch.device("cpu"), lambda: False, True)
    batch = {"input_ids": torch.zeros(2, 3, dtype=torch.long)}
    with caplog.at_level(logging.INFO, logger="areal_m2po.engine"):
        for _ in range(3):
            split = checks.train_split(None, batch, 1.0, _NoAutocast(), checkpointing=True)  # type: ignore[arg-type]
            assert split is None
        assert checks.train_split(None, batch, 1.0, _NoAutocast(), group_size=2) is None  # type: ignore[arg-type]
    lines = [r.getMessage() for r in caplog.records if "shared_prefix_train" in r.getMessage()]
    assert lines == [
        "mb_spec.shared_prefix_train: the plain split instead (gradient checkpointing: no KV "
        "cache in training)"
    ]
    spec = MicroBatchSpec(shared_prefix_train=False)
    off = CheckedForwards(spec, False, torch.device("cpu"), lambda: False, True)
    assert off.train_split(None, batch, 1.0, _NoAutocast(), checkpointing=True) is None  # type: ignore[arg-type]
    assert not off.train_fallback_said  # nothing to fall back from


def test_loss_context_has_one_source_of_the_loss_options():
    """A context built alone resolves the plan of its config; one built with a plan keeps it;
    the clipped-PPO options are the plan's."""
    from areal_m2po.trainer.ppo.loss_fn import LossContext

    cfg = ActorConfig(use_decoupled_loss=True, c_clip=3.0)
    alone = LossContext(cfg, 16)
    assert alone.plan == resolve_actor_plan(cfg, 16)
    assert alone.ppo_spec is alone.plan.ppo_spec and alone.ppo_spec.c_clip == 3.0
    given = _plan(use_sapo_loss=True)
    ctx = LossContext(cfg, 16, 2, given)
    assert ctx.plan is given and ctx.ppo_spec is None  # SAPO's plan: no clipped-PPO options


def test_an_actor_keeps_the_plan_it_is_handed():
    from areal_m2po.trainer.ppo.actor import PPOActor

    plan = _plan(m2_threshold=0.04, exact_behave_logp=False)
    actor = PPOActor(ActorConfig(m2_threshold=0.04), None, 2, 16, plan=plan)  # type: ignore[arg-type]
    assert actor.plan is plan and not actor.exact_behave_logp
