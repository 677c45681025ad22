"""A PPO actor over the tiny built-in model, as the actor tests build it (``tests/support`` is
on pytest's pythonpath)."""

from __future__ import annotations

from typing import Any

from areal_m2po.api.cli_args import ActorConfig, OptimizerConfig
from areal_m2po.trainer.ppo.actor import PPOActor


def plain_sgd() -> OptimizerConfig:
    """SGD with lr 1, no momentum, no clipping: an update is exactly minus the gradient."""
    return OptimizerConfig(type="sgd", lr=1.0, beta1=0.0, gradient_clipping=0.0)


def tiny_actor(
    group_size: int,
    max_new_tokens: int,
    total_steps: int = 1,
    *,
    exact_behave_logp: bool = True,
    prox_read_before_update: bool = False,
    **actor_kw: Any,
) -> PPOActor:
    """A :class:`PPOActor` on ``builtin:tiny`` (CPU) with ``overlong_filtering`` and
    :func:`plain_sgd` unless ``actor_kw`` says otherwise (``actor_kw``: ActorConfig fields;
    ``exact_behave_logp``, ``prox_read_before_update``: the actor's own arguments)."""
    from accelerate import Accelerator

    from areal_m2po.engine.train_engine import HFTrainEngine

    kw: dict[str, Any] = {"overlong_filtering": True, "optimizer": plain_sgd(), **actor_kw}
    cfg = ActorConfig(path="builtin:tiny", **kw)
    engine = HFTrainEngine(cfg, Accelerator(cpu=True), total_steps=total_steps)
    return PPOActor(
        cfg,
        engine,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        exact_behave_logp=exact_behave_logp,
        prox_read_before_update=prox_read_before_update,
    )
