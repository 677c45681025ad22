"""Run by tests/unit/test_fake_device.py in a process of its own. One training step of the tiny
model on a fake accelerator (tests/support/fake_device.py): the
engine's forward passes (padded, packed), the actor's micro-batch loss for every loss, the
backward pass and the optimizer step, with the model, the batch and everything they make on the
fake device; a CPU-made tensor in that path raises ``FakeTensorDeviceMismatchError``."""

from __future__ import annotations

import pytest
import torch
from actors import tiny_actor
from fake_device import HostReads, assert_on, fake_device, module_to_fake

from areal_m2po.api.cli_args import MicroBatchSpec, OptimizerConfig, RejectionSamplingConfig
from areal_m2po.engine import forward
from areal_m2po.engine.forward import forward_logprobs, forward_logprobs_packed
from areal_m2po.engine.optim import build_optimizer

B, P, C = 4, 3, 4  # rows (two prompts x two samples), prompt and completion columns
GROUP = 2
HOST_READS_PER_STEP = 0
"""Reads of a device tensor (host syncs on a GPU) in one micro-batch's forward and loss and one
optimizer step, with the column layout given: none (the loss statistics' extrema used to cost
one per micro-batch)."""

DATA_DEPENDENT_LAYOUT = (
    "utils/data.py trim_columns and completion_start read the batch's column layout "
    "(nonzero, argmax) on the host: two syncs per forward, by design"
)


def _batch(device: torch.device) -> dict[str, torch.Tensor]:
    """A rollout batch on ``device``: every row P prompt tokens then C generated ones."""
    t = P + C
    loss_mask = torch.zeros(B, t, dtype=torch.bool, device=device)
    loss_mask[:, P:] = True
    return {
        "input_ids": torch.ones(B, t, dtype=torch.long, device=device),
        "attention_mask": torch.ones(B, t, dtype=torch.bool, device=device),
        "loss_mask": loss_mask,
        "behave_logp": torch.zeros(B, t, device=device),
        "prox_logp": torch.zeros(B, t, device=device),
        "advantages": torch.zeros(B, t, device=device),
        "versions": torch.zeros(B, t, dtype=torch.long, device=device),
        "rewards": torch.zeros(B, device=device),
        "no_eos": torch.zeros(B, dtype=torch.bool, device=device),
    }


LOSSES = {
    "ppo": {},
    "decoupled+rejection": {
        "use_decoupled_loss": True,
        "rejection_sampling": RejectionSamplingConfig(upper=2.0),
    },
    "sapo": {"use_sapo_loss": True},
    "cispo": {"use_cispo_loss": True, "eps_clip": 1.0, "eps_clip_higher": 0.3},
    "gspo": {"importance_sampling_level": "sequence"},
    "loglinear": {"prox_logp_method": "loglinear", "use_decoupled_loss": True},
    "m2po-global": {"m2_threshold": 0.04, "m2_scope": "global"},
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_actor_microbatch_loss(monkeypatch, name):
    """The actor's micro-batch loss of every loss choice, and its gradient, on the device."""
    actor = tiny_actor(GROUP, C, **LOSSES[name])
    reads = HostReads()
    with fake_device(monkeypatch, reads) as dev:
        mb = _batch(dev)
        if name.startswith("m2po"):
            mb["m2po_mask"] = torch.ones(B, P + C, dtype=torch.bool, device=dev)
        logp = torch.zeros(B, P + C, device=dev, requires_grad=True)
        loss, stats = actor._microbatch_loss(logp, torch.zeros(B, P + C, device=dev), mb, 1)
        assert_on(dev, loss, "loss")
        assert_on(dev, stats, "stats")
        loss.backward()
        assert_on(dev, logp.grad, "d loss / d logp")
    assert reads.count == 0, f"host syncs in the micro-batch loss: {dict(reads.where)}"


def test_training_step(monkeypatch):
    """Forward, the actor's micro-batch loss, backward, gradient clipping and the AdamW step
    with its LR schedule: parameters, gradients and optimizer state all on the device."""
    actor = tiny_actor(GROUP, C, m2_threshold=0.04, m2_scope="global")
    model = actor.engine.unwrapped
    # the batch's column layout is read on the host (data-dependent: DATA_DEPENDENT_LAYOUT);
    # pinned to the true one, so the forward takes its main path
    monkeypatch.setattr(forward, "trim_columns", lambda mb: (mb, 0, P + C))
    monkeypatch.setattr(forward, "completion_start", lambda mb: P)
    reads = HostReads()
    with fake_device(monkeypatch, reads) as dev:
        module_to_fake(model, dev)
        mb = _batch(dev)
        mb["m2po_mask"] = torch.ones(B, P + C, dtype=torch.bool, device=dev)
        logp, ent = forward_logprobs(model, mb, temperature=1.0)
        assert_on(dev, (logp, ent))
        loss, stats = actor._microbatch_loss(logp, ent, mb, 0)
        assert_on(dev, (loss, stats))
        loss.backward()
        assert_on(dev, [p.grad for p in model.parameters()], "grads")
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt, sched = build_optimizer(model.parameters(), OptimizerConfig(type="adamw"), 2)
        opt.step()
        sched.step()
        assert_on(dev, norm, "grad norm")
        state = [{k: v for k, v in s.items() if k != "step"} for s in opt.state.values()]
        assert_on(dev, state, "optimizer state")  # (AdamW keeps its step count on the host)
        assert_on(dev, list(model.parameters()), "parameters")
    # host syncs of one micro-batch's forward and loss and one optimizer step; not a
    # benchmark, a tripwire: a new .item()/bool() on the hot path shows up here
    assert reads.count <= HOST_READS_PER_STEP, reads.where


def test_packed_forward_on_the_device(monkeypatch):
    """The packed forward's layout is built on the host and moved with the micro-batch."""
    actor = tiny_actor(GROUP, C)
    model = actor.engine.unwrapped
    with fake_device(monkeypatch, HostReads()) as dev:
        module_to_fake(model, dev)
        mb = _batch(dev)
        assert_on(dev, forward_logprobs_packed(model, mb, 1.0, True))


def test_engine_forward_tokens_keeps_a_device_batch_on_the_device(monkeypatch):
    """``HFTrainEngine.forward_tokens`` over a batch that lives on the device (it used to index
    it with host row indices and gather the results on the host)."""
    from areal_m2po.engine.train_engine import HFTrainEngine

    # packing off: its one-time check compares packed and padded values (data-dependent)
    actor = tiny_actor(GROUP, C, mb_spec=MicroBatchSpec(n_mbs=2, packing=False))
    engine = actor.engine
    monkeypatch.setattr(forward, "trim_columns", lambda mb: (mb, 0, P + C))
    monkeypatch.setattr(forward, "completion_start", lambda mb: P)
    with fake_device(monkeypatch, HostReads()) as dev:
        module_to_fake(engine.unwrapped, dev)
        monkeypatch.setattr(HFTrainEngine, "device", property(lambda self: dev))
        logp, ent = engine.forward_tokens(_batch(dev), temperature=1.0, compute_entropy=True)
        assert_on(dev, (logp, ent))


def test_batch_builder_makes_one_host_batch_that_moves(monkeypatch):
    """``groups_to_batch`` builds the batch on the host from Python lists (the engine moves
    micro-batches), all of it on one device, and every tensor of it moves to the device."""
    from areal_m2po.api.workflow_api import Trajectory, TrajectoryGroup
    from areal_m2po.rollout.batch_builder import groups_to_batch

    def traj(n_prompt: int, n_gen: int) -> Trajectory:
        t = n_prompt + n_gen
        mask = [False] * n_prompt + [True] * n_gen
        return Trajectory(
            input_ids=list(range(1, t + 1)),
            loss_mask=mask,
            logprobs=[-0.5 if m else 0.0 for m in mask],
            versions=[0 if m else -1 for m in mask],
            prompt_len=n_prompt,
            reward=1.0,
        )

    groups = [TrajectoryGroup([traj(2, 3), traj(2, 1)]), TrajectoryGroup([traj(3, 2), traj(3, 2)])]
    with fake_device(monkeypatch, HostReads()) as dev:
        batch = groups_to_batch(groups, pad_id=0)
        assert_on(torch.device("cpu"), batch, "host batch")
        assert_on(dev, {k: v.to(dev) for k, v in batch.items()}, "moved batch")


def test_shared_prefix_index_on_the_device(monkeypatch):
    """The shared-prefix prompt index of a batch on the device stays on it (ea65b23)."""
    from areal_m2po.engine.shared_prefix import prompt_index

    monkeypatch.setattr("areal_m2po.engine.shared_prefix.completion_start", lambda mb: P)
    with fake_device(monkeypatch, HostReads()) as dev:
        found = prompt_index(_batch(dev))
        assert found is not None and found[0] == P
        assert_on(dev, found[1], "prompt_of_row")


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_pp"])
def test_actor_advantages_of_a_device_batch(monkeypatch, estimator):
    """``PPOActor.compute_advantages`` keeps a batch that lives on the device there (GAE's
    column loop is data-dependent: fake_algo_cases.DATA_DEPENDENT)."""
    norm = {} if estimator == "grpo" else {"adv_norm": None}  # the others bring their own
    actor = tiny_actor(GROUP, C, adv_estimator=estimator, **norm)
    with fake_device(monkeypatch, HostReads()) as dev:
        batch = _batch(dev)
        actor.compute_advantages(batch)
        assert_on(dev, batch, "batch with advantages")
