"""The actor-loss seam (actor.loss_fn / PPOActor(loss_fn=...)) and the step-phase callbacks."""

from __future__ import annotations

import math

import pytest
import torch

from areal_m2po.api.callbacks import Phases, StepCallback
from areal_m2po.api.cli_args import ActorConfig, ConfigError, PPOConfig
from areal_m2po.api.errors import RunError
from areal_m2po.areal.trainer.ppo.actor import _apply_m2po_masking
from areal_m2po.trainer.ppo.actor import PPOActor
from areal_m2po.trainer.ppo.loss_fn import LossContext, library_actor_loss, load_actor_loss_fn


def _micro_batch() -> dict[str, torch.Tensor]:
    """Two rows, stale behaviour log-probs: M2PO with threshold 0.05 masks some tokens."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.tensor([[True] * 5 + [False], [True] * 3 + [False] * 3])
    behave = -2.0 * torch.rand(2, 6, generator=gen)
    prox = behave + 0.5 * torch.randn(2, 6, generator=gen)
    return {
        "loss_mask": mask,
        "behave_logp": torch.where(mask, behave, 0.0),
        "prox_logp": torch.where(mask, prox, 0.0),
        "advantages": torch.where(mask, torch.tensor([[1.0], [-0.5]]), 0.0),
        "versions": torch.zeros(2, 6, dtype=torch.long),
    }


class Recorder:
    """A loss function that records what the actor hands it and returns sum(logp)."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, torch.Tensor], LossContext]] = []

    def __call__(self, logp, entropy, batch, ctx):
        self.calls.append((batch, ctx))
        return logp.sum(), {"rec/n": torch.tensor(1.0)}


def test_actor_hands_the_loss_prox_and_microbatch_m2po_mask():
    rec = Recorder()
    cfg = ActorConfig(m2_threshold=0.05, m2_scope="microbatch")
    actor = PPOActor(cfg, None, 2, 6, loss_fn=rec)  # type: ignore[arg-type]
    mb = _micro_batch()
    logp = mb["prox_logp"] + 0.1
    loss, stats = actor._microbatch_loss(logp, torch.zeros_like(logp), mb, step_in_update=3)
    batch, ctx = rec.calls[0]
    expected = _apply_m2po_masking(mb["behave_logp"], mb["prox_logp"], mb["loss_mask"], 0.05)
    assert not bool(expected[mb["loss_mask"]].all())  # the batch does mask something
    assert torch.equal(batch["m2po_mask"], expected)
    assert torch.equal(batch["prox_logp"], mb["prox_logp"])
    assert (ctx.config, ctx.max_new_tokens, ctx.step_in_update) == (cfg, 6, 3)
    assert float(stats["actor/loss"]) == float(logp.sum())
    assert "rec/n" in stats and "m2po/masked_fraction" in stats and "actor/entropy" in stats


def test_no_m2po_no_mask_key_and_loglinear_prox():
    rec = Recorder()
    cfg = ActorConfig(m2_threshold=None, prox_logp_method="loglinear", use_decoupled_loss=True)
    actor = PPOActor(cfg, None, 2, 6, loss_fn=rec)  # type: ignore[arg-type]
    actor.engine = type("E", (), {"version": 1})()  # type: ignore[assignment]
    mb = _micro_batch()
    logp = mb["behave_logp"] + 0.4
    actor._microbatch_loss(logp, torch.zeros_like(logp), mb, step_in_update=1)
    batch, _ = rec.calls[0]
    assert "m2po_mask" not in batch
    # behaviour version 0, proximal 1, current 2: alpha = 1/2, prox = behave + 0.2
    assert torch.allclose(batch["prox_logp"], mb["behave_logp"] + 0.2)


def test_default_loss_is_the_library_loss():
    cfg = ActorConfig(m2_threshold=0.05, m2_scope="microbatch")
    actor = PPOActor(cfg, None, 2, 6)  # type: ignore[arg-type]
    assert actor.loss_fn is library_actor_loss
    mb = _micro_batch()
    logp = mb["prox_logp"] + 0.05
    loss, _ = actor._microbatch_loss(logp, torch.zeros_like(logp), mb, step_in_update=0)
    # token-mean over the 8 valid tokens of -A * ratio on the kept ones (ratio inside the clip)
    keep = mb["loss_mask"] & _apply_m2po_masking(
        mb["behave_logp"], mb["prox_logp"], mb["loss_mask"], 0.05
    )
    expected = -(mb["advantages"] * math.exp(0.05))[keep].sum() / 8
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)


def test_loss_fn_by_dotted_path(tmp_path, monkeypatch):
    (tmp_path / "my_losses.py").write_text(
        "def zero(logp, entropy, batch, ctx):\n    return 0 * logp.sum(), {}\n"
    )
    (tmp_path / "broken_losses.py").write_text("x = 1\nraise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_actor_loss_fn("my_losses:zero")
    actor = PPOActor(ActorConfig(loss_fn="my_losses:zero"), None, 2, 6)  # type: ignore[arg-type]
    assert actor.loss_fn is fn
    with pytest.raises(ConfigError, match=r"actor\.loss_fn.*broken_losses\.py:2.*boom"):
        load_actor_loss_fn("broken_losses:zero")
    with pytest.raises(ConfigError, match=r"actor\.loss_fn.*did you mean 'zero'"):
        PPOActor(ActorConfig(loss_fn="my_losses:zeros"), None, 2, 6)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="loss_fn"):
        ActorConfig(loss_fn=3)  # type: ignore[arg-type]


def test_trainer_refuses_a_loss_in_both_config_and_argument(tmp_path):
    from areal_m2po.trainer.rl_trainer import RLTrainer

    cfg = PPOConfig(actor=ActorConfig(loss_fn="x:y"), output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="actor.loss_fn.*pass one"):
        RLTrainer(cfg, actor_loss_fn=library_actor_loss)


def test_phases_time_into_stats_and_tell_callbacks_even_on_error():
    events: list[tuple[str, str]] = []

    class Log(StepCallback):
        def on_phase_begin(self, name: str) -> None:
            events.append(("begin", name))

        def on_phase_end(self, name: str, seconds: float) -> None:
            assert seconds >= 0
            events.append(("end", name))

    phases = Phases([Log()])
    stats: dict[str, float] = {}
    with phases("update", stats), phases("m2po"):
        pass
    with phases("update", stats):
        pass
    with pytest.raises(RuntimeError), phases("sync"):
        raise RuntimeError("x")
    assert events == [
        ("begin", "update"),
        ("begin", "m2po"),
        ("end", "m2po"),
        ("end", "update"),
        ("begin", "update"),
        ("end", "update"),
        ("begin", "sync"),
        ("end", "sync"),
    ]
    assert list(stats) == ["timing/update_s"] and stats["timing/update_s"] >= 0


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        (lambda logp: float(logp.sum()), "float"),
        (lambda logp: logp.sum(), "Tensor[]"),
        (lambda logp: (logp, {}), "(Tensor[2, 6], dict)"),
        (lambda logp: (logp.sum(), None), "(Tensor[], NoneType)"),
    ],
)
def test_a_custom_loss_that_returns_the_wrong_thing_is_one_line(returned, shown):
    def bad_loss(logp, entropy, batch, ctx):
        return returned(logp)

    actor = PPOActor(ActorConfig(), None, 2, 6, loss_fn=bad_loss)  # type: ignore[arg-type]
    mb = _micro_batch()
    with pytest.raises(RunError) as caught:
        actor._microbatch_loss(mb["prox_logp"], torch.zeros(2, 6), mb, step_in_update=0)
    assert str(caught.value) == (
        f"actor.loss_fn: {__name__}:test_a_custom_loss_that_returns_the_wrong_thing_is_one_line"
        f".<locals>.bad_loss returned {shown}; a loss returns (loss, stats): a 0-dim tensor and "
        "a dict of named statistics"
    )


def test_trainer_resolves_the_plan_and_loads_the_estimator_once(tmp_path, monkeypatch):
    """The trainer resolves the actor's plan once and hands it to the actor with the loss and
    the advantage estimator it loaded once; the actor resolves and loads nothing itself."""
    from tiny_runs import make_cfg

    from areal_m2po.trainer import rl_trainer
    from areal_m2po.trainer.ppo import actor as actor_mod

    calls: list[str] = []

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)

        return wrapper

    for mod in (rl_trainer, actor_mod):
        for name in ("resolve_actor_plan", "load_adv_estimator", "load_actor_loss_fn"):
            monkeypatch.setattr(mod, name, counted(name, getattr(mod, name)))
    trainer = rl_trainer.RLTrainer(make_cfg(tmp_path, steps=1))
    try:
        assert sorted(calls) == ["load_actor_loss_fn", "load_adv_estimator", "resolve_actor_plan"]
        assert trainer.actor.adv_estimator is trainer.adv_estimator
        assert trainer.actor.loss_fn is trainer.actor_loss_fn is library_actor_loss
    finally:
        trainer.close()
